"""No preset diverges: the presets' solver rule (:func:`dignn.presets.preset_solver`) per
dataset and graph kind, and short trainings with the preset on generated graphs the presets
were not tuned on (undirected and directed, homophilous and heterophilous, two sizes), with
the warnings of a diverging solve or of mu below lambda_max raised as errors.
``bench/accuracy/preset_divergence.py`` runs the same on every dataset available offline."""
import functools
import warnings

import pytest
import torch

from dignn import train
from dignn.data import DATASETS, NodeDataset
from dignn.data.generated import csbm
from dignn.presets import (DIRECTED_DATASETS, PAPER_TABLE7_NEURAL, USER_DATA, TrainConfig,
                           preset_config, preset_solver)
from dignn.spectral import MuBelowSpectrumWarning
from dignn.training import _is_directed, _spectral, build_model, train_node_split
from dignn_kernels import DivergenceWarning


# ------------------------------------------------------------------------ the rule --

def test_the_rule_follows_the_graph_not_mu():
    assert preset_solver(False) == "cg" and preset_solver(True) == "anderson"
    # 16-bit iterates exist for the fixed point only
    assert preset_solver(False, storage_dtype="bfloat16") == "fixed_point"
    assert preset_solver(True, storage_dtype="float16") == "fixed_point"
    with pytest.raises(TypeError, match="directed"):
        preset_solver("yes")


def test_every_named_dataset_gets_the_rule_under_both_presets():
    assert DIRECTED_DATASETS == {"chameleon-directed", "squirrel-directed"}
    for name in DATASETS:
        want = "anderson" if name in DIRECTED_DATASETS else "cg"
        for laplacian in ("neural", "rw"):
            for preset in ("tuned", "paper"):
                assert preset_config(name, laplacian, preset).solver == want, \
                    (name, laplacian, preset)


def test_the_rule_holds_for_every_mu_and_yields_to_explicit_choices():
    # table 7's mu 1.25 (below the trained MUTAG/NCI1 lambda_max) and Cora's 2.1 alike
    assert PAPER_TABLE7_NEURAL["mutag"]["mu"] == 1.25
    for mu in (0.5, 1.25, 2.1, 10.0):
        assert preset_config("mutag", mu=mu).solver == "cg"
        assert preset_config("chameleon-directed", mu=mu).solver == "anderson"
    assert preset_config("cora", solver="fixed_point").solver == "fixed_point"
    assert preset_config("chameleon-directed", solver="cg").solver == "cg"
    config = preset_config("cora", storage_dtype="bfloat16")
    assert (config.solver, config.storage_dtype) == ("fixed_point", "bfloat16")


def test_user_data_and_generated_rows_take_directedness_as_told():
    for key in (USER_DATA, "csbm"):
        assert preset_config(key).solver == "cg"  # a user's graph: undirected unless told
        assert preset_config(key, directed=False).solver == "cg"
        assert preset_config(key, directed=True).solver == "anderson"
        # the rest of the row does not move with the solver
        assert preset_config(key, directed=True).replace(solver="cg") == preset_config(key)
    assert preset_config("chameleon", directed=True).solver == "anderson"


def _directed(data: NodeDataset, seed: int = 0) -> NodeDataset:
    """``data`` with one random direction of each undirected edge."""
    ei = data.edge_index
    keep = ei[0] < ei[1]
    src, dst = ei[0][keep], ei[1][keep]
    flip = torch.rand(src.numel(), generator=torch.Generator().manual_seed(seed)) < 0.5
    edge_index = torch.stack([torch.where(flip, dst, src), torch.where(flip, src, dst)])
    return NodeDataset(data.name + "-directed", data.x, data.y, edge_index, data.num_classes,
                       data.splits, data.description + ", directed")


def test_directedness_is_read_from_the_graph():
    data = csbm(num_nodes=60, num_splits=1)
    assert not _is_directed(data) and _is_directed(_directed(data))


def test_train_graph_data_runs_the_rule_on_a_directed_graph_without_falling_back():
    from dignn import train_graph_data
    data = _directed(csbm(num_nodes=80, num_splits=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DivergenceWarning)
        warnings.simplefilter("error", MuBelowSpectrumWarning)
        # the layer's cg -> anderson fallback warning: the preset must not need it
        warnings.filterwarnings("error", message=".*runs instead")
        run = train_graph_data(data, device="cpu", epochs=3, hidden=8)
    assert run.config.solver == "anderson"


# ------------------------------------------------ the spectral check after training --

def _path_data():
    edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    return NodeDataset("path", torch.eye(4), torch.tensor([0, 1, 0, 1]), edge_index, 2, [])


def test_the_spectral_check_warns_only_where_the_solver_needs_the_bound():
    """rw on a path has lambda_max = 2 > mu = 1.5: the fixed point needs mu > lambda_max and
    is warned of; cg solves the equation for every mu > 0 and is not."""
    data = _path_data()
    for solver, warned in (("fixed_point", True), ("anderson", True), ("cg", False)):
        model = build_model(data, TrainConfig(laplacian="rw", mu=1.5, hidden=4,
                                              solver=solver))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lam = _spectral(model, data.x, data.edge_index, "test")
        assert lam == pytest.approx(2.0, abs=1e-3)
        got = any(issubclass(w.category, MuBelowSpectrumWarning) for w in caught)
        assert got == warned, solver


# ------------------------------------------------ trainings on graphs not tuned on --

GRAPHS = [(n, hom, directed) for n in (120, 400) for hom in (0.85, 0.15)
          for directed in (False, True)]


@pytest.mark.parametrize("num_nodes,homophily,directed", GRAPHS)
def test_the_preset_does_not_diverge_on_generated_graphs(num_nodes, homophily, directed):
    data = csbm(num_nodes=num_nodes, homophily=homophily, num_splits=1, seed=1)
    if directed:
        data = _directed(data)
    config = preset_config("csbm", directed=_is_directed(data), epochs=40, hidden=16)
    fit = functools.partial(train_node_split, keep_model=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DivergenceWarning)
        warnings.simplefilter("error", MuBelowSpectrumWarning)
        warnings.filterwarnings("error", message=".*runs instead")
        run = train(data, config, [0], progress=False, device="cpu", fit=fit)
        split = run.splits[0]
        model = split.model.eval()
        layer = model.diffusion
        with torch.no_grad():
            model(data.x, data.edge_index)
        assert layer.solver_used == ("anderson" if directed else "cg")
        # spectral normalization and mu = 3 keep the trained spectrum below mu (the row's
        # documented constraint; cg and anderson would solve beyond it too)
        assert 0 <= split.lambda_max_end < config.mu
        # the preset's solve reaches its tolerance, and converges on to a tight one
        assert layer.relative_residual <= config.tol
        layer.max_iter, layer.tol = 200, 1e-6  # (float32)
        with torch.no_grad():
            model(data.x, data.edge_index)
        assert layer.relative_residual <= 1e-6


def test_where_the_fixed_point_diverges_the_rule_does_not():
    """mu = 0.5 is far below lambda_max of rw (~2): the paper's iteration diverges (a
    DivergenceWarning, and mu below lambda_max is warned of), the preset's cg reaches the
    equilibrium."""
    data = csbm(num_nodes=120, num_splits=1, seed=2)
    config = preset_config("csbm", "rw", mu=0.5, epochs=3, hidden=8)
    assert config.solver == "cg"
    fit = functools.partial(train_node_split, keep_model=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(data, config.replace(solver="fixed_point"), [0], progress=False, device="cpu")
    kinds = {w.category for w in caught}
    assert DivergenceWarning in kinds and MuBelowSpectrumWarning in kinds
    with warnings.catch_warnings():
        warnings.simplefilter("error", DivergenceWarning)
        warnings.simplefilter("error", MuBelowSpectrumWarning)
        run = train(data, config, [0], progress=False, device="cpu", fit=fit)
    split = run.splits[0]
    assert split.lambda_max_end > 2 * config.mu  # far beyond the fixed point's condition
    layer = split.model.eval().diffusion
    with torch.no_grad():
        split.model(data.x, data.edge_index)
    assert layer.solver_used == "cg" and layer.relative_residual <= config.tol
    layer.max_iter, layer.tol = 200, 1e-6
    with torch.no_grad():
        split.model(data.x, data.edge_index)
    assert layer.relative_residual <= 1e-6
