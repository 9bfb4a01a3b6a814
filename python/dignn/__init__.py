"""dignn: DIGNN models (Dirichlet Implicit Graph Neural Networks) on the fused kernels of
:mod:`dignn_kernels`.

- :mod:`dignn.models`: :class:`DIGNNNodeClassifier` (input units ``mlp``, ``adj``, ``linkx``)
  and :class:`DIGNNGraphClassifier`.
- :mod:`dignn.data`: the paper's datasets through PyTorch Geometric, generated graphs, and
  users' own graphs (:func:`train_graph_data` trains on a PyG ``Data`` or a saved file).
- :mod:`dignn.spectral`: lambda_max(Delta) and the mu check.
- :mod:`dignn.presets`, :mod:`dignn.training`: the paper's hyperparameters and training.
- :mod:`dignn.sweep`, :mod:`dignn.protocols`: hyperparameter selection on validation accuracy only,
  and the holdout and GIN (10-fold CV) evaluation protocols.
- :mod:`dignn.device`: ``device="auto" | "cpu" | "cuda" | "cuda:N"`` and thread choice.
- ``dignn train`` / ``dignn sweep`` / ``dignn plot`` (:mod:`dignn.cli`): the command line.

The names below are imported on first use, so that ``dignn --help`` does not load torch.
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "DIGNNNodeClassifier": "models", "DIGNNGraphClassifier": "models",
    "NodeDataset": "data", "GraphDataset": "data", "load_dataset": "data",
    "TrainConfig": "presets", "preset_config": "presets",
    "MuBelowSpectrumWarning": "spectral", "check_mu": "spectral",
    "estimate_lambda_max": "spectral", "RunResult": "training", "train": "training",
    "resolve_device": "device",
    "run_sweep": "sweep", "SweepResult": "sweep", "parse_grid": "sweep",
    "gin_folds": "protocols", "gin_score": "protocols",
    "train_graph_data": "training", "from_pyg": "data.custom",
    "load_user_file": "data.custom", "UserDataError": "data.custom",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dignn' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
