"""Does any preset diverge? Trains each dataset available here, and generated graphs of other
sizes, homophilies and a directed variant, with its preset (the solver the preset's rule,
:func:`dignn.presets.preset_solver`, picks) and, for comparison, with the paper's fixed-point
iteration at the same mu; records after training the solver that ran, lambda_max of the trained
Delta against mu, the final solve's iterations and relative residual (forward and adjoint), and
every warning raised during training (DivergenceWarning, MuBelowSpectrumWarning, the cg ->
anderson fallback).

    OMP_NUM_THREADS=1 python bench/accuracy/preset_divergence.py --data-root ../shared/data \\
        --out bench/results/preset_divergence.json

``--cases`` picks cases by name (default: all); ``--accuracy`` adds the Cora comparison
(tuned preset, 400 epochs, splits 0-2, the rule's solver against the fixed point).

Per case and variant (``preset``: the preset as a user gets it; ``solver=fixed_point``: the
same with the paper's iteration, the old rule): ``warnings`` counts what training raised
(every epoch's solves and the spectral checks at initialization and after training);
per split, ``solver`` is the solver that ran, ``lambda_max_end`` that of the selected
weights (the spectral check's estimate), ``iterations`` and ``relative_residual`` the final
forward solve's with the preset's sweeps (the fixed point's residual is its relative step
||Z_t - Z_{t-1}|| / ||Z_t||, cg's and anderson's that of the equation relative to ||X||),
``backward_*`` its adjoint's, and ``long_solve_*`` the same forward solve given
``LONG_SOLVE`` sweeps (converging, or not); ``final_solve_warnings`` the divergence
warnings of those last solves.
"""
import argparse
import functools
import json
import math
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import record  # noqa: E402  (bench/record.py: the records' commit, machine and versions)

from dignn import train  # noqa: E402
from dignn.data import NodeDataset, load_dataset  # noqa: E402
from dignn.data.generated import csbm  # noqa: E402
from dignn.presets import preset_config  # noqa: E402
from dignn.spectral import MuBelowSpectrumWarning  # noqa: E402
from dignn.training import _is_directed, train_graph_split, train_node_split  # noqa: E402
from dignn_kernels import DivergenceWarning  # noqa: E402


def directed_variant(data: NodeDataset, keep_both: float = 0.15, seed: int = 0
                     ) -> NodeDataset:
    """``data``'s graph made directed: of each undirected pair one direction, picked at
    random, and both for a share ``keep_both`` (Chameleon's links: 36,101 on 31,371 pairs)."""
    ei = data.edge_index
    lo, hi = ei[0], ei[1]
    first = lo < hi  # each undirected pair once
    src, dst = lo[first], hi[first]
    gen = torch.Generator().manual_seed(seed)
    flip = torch.rand(src.numel(), generator=gen) < 0.5
    both = torch.rand(src.numel(), generator=gen) < keep_both
    a = torch.where(flip, dst, src)
    b = torch.where(flip, src, dst)
    edge_index = torch.cat([torch.stack([a, b]), torch.stack([b[both], a[both]])], dim=1)
    return NodeDataset(data.name + "-directed", data.x, data.y, edge_index, data.num_classes,
                       data.splits, f"{data.description}, made directed")


def generated(num_nodes: int, homophily: float, directed: bool = False) -> NodeDataset:
    data = csbm(num_nodes=num_nodes, homophily=homophily, num_splits=3, seed=0)
    return directed_variant(data) if directed else data


# name -> (loader(root, cache), preset_config dataset key, overrides, splits)
def _cases(root, cache):
    def named(name):
        return lambda: load_dataset(name, root, cache)
    return {
        "cora": (named("cora"), "cora", dict(epochs=150), [0, 1]),
        "chameleon-directed": (named("chameleon-directed"), "chameleon-directed",
                               dict(epochs=150), [0, 1]),
        "chameleon": (named("chameleon"), "chameleon", dict(epochs=150), [0, 1]),
        "amherst41": (named("amherst41"), "amherst41", dict(epochs=100), [0, 1]),
        "cornell5": (named("cornell5"), "cornell5", dict(epochs=40), [0]),
        "mutag": (named("mutag"), "mutag", dict(epochs=60), [0, 1]),
        "nci1": (named("nci1"), "nci1", dict(epochs=15), [0]),
        "csbm-500-hom0.9": (lambda: generated(500, 0.9), "csbm", dict(epochs=150), [0, 1]),
        "csbm-500-hom0.1": (lambda: generated(500, 0.1), "csbm", dict(epochs=150), [0, 1]),
        "csbm-4000-hom0.8": (lambda: generated(4000, 0.8), "csbm", dict(epochs=100), [0]),
        "csbm-4000-hom0.2": (lambda: generated(4000, 0.2), "csbm", dict(epochs=100), [0]),
        "csbm-1500-hom0.75-directed": (lambda: generated(1500, 0.75, True), "csbm",
                                       dict(epochs=150, directed=True), [0, 1]),
        "csbm-1500-hom0.2-directed": (lambda: generated(1500, 0.2, True), "csbm",
                                      dict(epochs=150, directed=True), [0, 1]),
        # stress: the CSBM row without its spectral normalization (as every real dataset's
        # row), where lambda_max is free to pass mu
        "csbm-1500-hom0.75-no-spectral-norm": (lambda: generated(1500, 0.75), "csbm",
                                               dict(epochs=150, spectral_norm=False,
                                                    mu=2.1), [0, 1]),
        "csbm-1500-hom0.75-directed-no-spectral-norm": (
            lambda: generated(1500, 0.75, True), "csbm",
            dict(epochs=150, spectral_norm=False, directed=True), [0, 1]),
        # the random-walk Laplacian on the directed links (paper preset, mu 2.2 > 2 >= its
        # lambda_max): the fixed point cannot diverge there, but does it converge?
        "chameleon-directed-rw": (named("chameleon-directed"), "chameleon-directed",
                                  dict(epochs=150, laplacian="rw", preset="paper"), [0, 1]),
        # graphs users bring: the generic row (directedness found as train_graph_data does)
        "user-data-csbm-800-hom0.5": (lambda: generated(800, 0.5), "user-data",
                                      dict(epochs=100, directed="detect"), [0]),
        "user-data-csbm-800-hom0.5-directed": (lambda: generated(800, 0.5, True),
                                               "user-data", dict(epochs=100,
                                                                 directed="detect"), [0]),
    }


LONG_SOLVE = 500


def _final_solve(model, dataset, split):
    """The trained layer's solve on the whole graph (node tasks) or on the held-out graphs
    of ``split`` in one batch (graph tasks), forward and adjoint (loss = sum of logits) with
    the preset's sweeps, then forward again with ``LONG_SOLVE`` sweeps."""
    model.eval()
    layer = model.diffusion
    if dataset.task == "graph":
        from torch_geometric.data import Batch
        idx = dataset.splits[split].test.tolist()
        batch = Batch.from_data_list([dataset.graphs[i] for i in idx])
        x = batch.x.to(next(model.parameters()).dtype).requires_grad_(True)
        out = model(x, batch.edge_index, batch.batch, batch.num_graphs)
    else:
        x = dataset.x.to(next(model.parameters()).dtype)
        if not x.is_sparse:
            x = x.requires_grad_(True)
        out = model(x, dataset.edge_index)
    forward = dict(solver=layer.solver_used, iterations=layer.iterations,
                   relative_residual=layer.relative_residual)
    out.sum().backward()
    record = dict(**forward, backward_iterations=layer.backward_iterations,
                  backward_relative_residual=layer.backward_relative_residual)
    # the same solve given LONG_SOLVE sweeps: does it converge, or diverge?
    cap = layer.max_iter
    layer.max_iter = LONG_SOLVE
    with torch.no_grad():
        if dataset.task == "graph":
            model(x.detach(), batch.edge_index, batch.batch, batch.num_graphs)
        else:
            model(x.detach(), dataset.edge_index)
    layer.max_iter = cap
    record.update(long_solve_iterations=layer.iterations,
                  long_solve_relative_residual=layer.relative_residual)
    return record


def run_case(name, dataset, key, overrides, splits, solver=None):
    """Trains ``dataset`` with ``preset_config(key, ...)`` (``solver``: the comparison's
    override; ``overrides`` may name the ``laplacian``, the ``preset`` and ``directed``,
    ``"detect"`` finding it as :func:`dignn.train_graph_data` does) and returns the
    per-split record, warnings caught as they were raised."""
    overrides = dict(overrides)
    laplacian = overrides.pop("laplacian", "neural")
    preset = overrides.pop("preset", "tuned")
    directed = overrides.pop("directed", None)
    if directed == "detect":
        directed = _is_directed(dataset)
    extra = {} if directed is None else {"directed": directed}
    config = preset_config(key, laplacian, preset, **extra, **overrides,
                           **({} if solver is None else {"solver": solver}))
    fit = functools.partial(train_graph_split if dataset.task == "graph" else
                            train_node_split, keep_model=True)
    torch.manual_seed(0)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = train(dataset, config, splits, progress=False, device="cpu", fit=fit)
    seconds = time.perf_counter() - start
    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        finals = [_final_solve(s.model, dataset, s.split) for s in run.splits]
    final_warnings = sorted({f"{w.category.__name__}: {str(w.message)[:160]}" for w in after
                             if issubclass(w.category, DivergenceWarning)})
    kinds = {"DivergenceWarning": DivergenceWarning,
             "MuBelowSpectrumWarning": MuBelowSpectrumWarning}
    counts = {k: sum(issubclass(w.category, c) for w in caught) for k, c in kinds.items()}
    fallback = [w for w in caught if "runs instead" in str(w.message)]
    counts["solver_fallback"] = len(fallback)
    messages = sorted({f"{w.category.__name__}: {str(w.message)[:240]}" for w in caught
                       if issubclass(w.category, (DivergenceWarning, MuBelowSpectrumWarning))
                       or w in fallback})
    per_split = []
    for s, final in zip(run.splits, finals):
        per_split.append(dict(
            split=s.split, test_acc=s.test_acc, val_acc=s.val_acc, best_epoch=s.best_epoch,
            epochs_run=s.epochs_run, lambda_max_start=s.lambda_max_start,
            lambda_max_end=s.lambda_max_end,
            lambda_over_mu=s.lambda_max_end / config.mu,
            converged=bool(final["relative_residual"] is not None and
                           math.isfinite(final["relative_residual"]) and
                           final["relative_residual"] <= max(config.tol, 1e-5)),
            **final))
    return dict(case=name, dataset=dataset.name, laplacian=laplacian, preset=preset,
                preset_key=key, directed=directed,
                solver_configured=config.solver, mu=config.mu,
                spectral_norm=config.spectral_norm, max_iter=config.max_iter, tol=config.tol,
                epochs=config.epochs, seconds=round(seconds, 1), warnings=counts,
                warning_messages=messages, final_solve_warnings=final_warnings,
                splits=per_split,
                no_divergence=counts["DivergenceWarning"] == 0 and
                counts["MuBelowSpectrumWarning"] == 0)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--cases", default=None, help="comma-separated case names")
    parser.add_argument("--compare", default="fixed_point",
                        help="the comparison solver ('' for none)")
    parser.add_argument("--accuracy", action="store_true",
                        help="Cora, tuned preset, 400 epochs, splits 0-2: rule vs fixed point")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    commit = record.git_head()  # the code that runs: read before, not after, the long run
    cases = _cases(args.data_root, args.cache_dir)
    names = list(cases) if args.cases is None else args.cases.split(",")
    records = []
    for name in names:
        load, key, overrides, splits = cases[name]
        dataset = load()
        for solver in [None] + ([args.compare] if args.compare else []):
            rec = run_case(name, dataset, key, overrides, splits, solver)
            rec["variant"] = "preset" if solver is None else f"solver={solver}"
            records.append(rec)
            print(json.dumps({k: rec[k] for k in ("case", "variant", "mu", "warnings")}),
                  [(s["solver"], round(s["lambda_max_end"], 3), s["iterations"],
                    f"{s['relative_residual']:.2e}", round(s["test_acc"], 3))
                   for s in rec["splits"]], flush=True)
    accuracy = None
    if args.accuracy:
        dataset = load_dataset("cora", args.data_root, args.cache_dir)
        accuracy = []
        for solver in (None, "fixed_point"):
            rec = run_case("cora-400", dataset, "cora", dict(epochs=400), [0, 1, 2], solver)
            rec["variant"] = "preset" if solver is None else f"solver={solver}"
            accuracy.append(rec)
            print(rec["variant"], [round(s["test_acc"], 4) for s in rec["splits"]], flush=True)
    doc = {"schema": "preset_divergence/1",
           "command": [sys.executable, "bench/accuracy/preset_divergence.py"] + list(
               sys.argv[1:] if argv is None else argv),
           "commit": commit,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": record.machine(torch.device("cpu"), torch.get_num_threads()),
           "versions": record.versions(), "cases": records, "cora_accuracy": accuracy}
    if args.out:
        record.write_json(doc, args.out)
    return doc


if __name__ == "__main__":
    main()
