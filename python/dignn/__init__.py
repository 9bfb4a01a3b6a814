"""dignn: DIGNN models (Dirichlet Implicit Graph Neural Networks) on the fused kernels of
:mod:`dignn_kernels`.

- :mod:`dignn.models`: :class:`DIGNNNodeClassifier` (input units ``mlp``, ``adj``, ``linkx``)
  and :class:`DIGNNGraphClassifier`.
- :mod:`dignn.data`: the paper's datasets through PyTorch Geometric, and generated graphs.
- :mod:`dignn.spectral`: lambda_max(Delta) and the mu check.
- :mod:`dignn.presets`, :mod:`dignn.training`: the paper's hyperparameters and training.
- ``dignn train`` / ``dignn plot`` (:mod:`dignn.cli`): the command line.
"""
from .data import GraphDataset, NodeDataset, load_dataset
from .models import DIGNNGraphClassifier, DIGNNNodeClassifier
from .presets import TrainConfig, preset_config
from .spectral import MuBelowSpectrumWarning, check_mu, estimate_lambda_max
from .training import RunResult, train

__version__ = "0.1.0"
__all__ = ["DIGNNNodeClassifier", "DIGNNGraphClassifier", "NodeDataset", "GraphDataset",
           "load_dataset", "TrainConfig", "preset_config", "MuBelowSpectrumWarning",
           "check_mu", "estimate_lambda_max", "RunResult", "train"]
