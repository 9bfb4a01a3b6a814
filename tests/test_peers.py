"""bench/peers/peers.py, the peer harness: on a tiny directed graph every peer available here agrees
with the dense float64 solve, the authors' peer loads from a checkout through this project's
stand-ins for torch_scatter/torch_sparse, the JSON has its schema and is written atomically,
the budget and an absent torchdeq are recorded, and the CPU memory method measures what it
should. The authors' real code is tested only where $DIGNN_AUTHORS names a checkout."""
import importlib.util
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import load_module

REPO = Path(__file__).resolve().parents[1]


peers = load_module("dignn_bench_peers", REPO / "bench" / "peers" / "peers.py")
scatter_stand_in = load_module("dignn_stand_in_torch_scatter",
                         REPO / "bench" / "peers" / "stand_ins" / "torch_scatter" / "__init__.py")
sparse_stand_in = load_module("dignn_stand_in_torch_sparse",
                        REPO / "bench" / "peers" / "stand_ins" / "torch_sparse" / "__init__.py")

TINY = "random-50-300"  # directed, with repeated edges and self-loops
# torchdeq is the `bench` extra, not a test dependency: where it is absent its peers must be
# recorded as absent (and everything else measured); where present they must agree
HAVE_TORCHDEQ = importlib.util.find_spec("torchdeq") is not None


def _absent_torchdeq(r) -> bool:
    """Whether ``r`` is a torchdeq peer's result on a machine without torchdeq (then it must
    say so)."""
    if HAVE_TORCHDEQ or not r["peer"].startswith("torchdeq-"):
        return False
    # (the peer's status, or, where only the tolerance pass built it, its run's)
    statuses = [r["status"]] + [run["status"] for run in
                                (r.get("tolerance") or {}).get("runs", [])]
    assert any(s.startswith("absent: torchdeq not importable") for s in statuses), r
    return True

# A stand-in for the authors' checkout: the same module layout and names (DEQFixedPoint,
# ImplicitFunc_Neural, fwd_solver, torch_scatter's scatter_add), minimal code of our own for
# the same equation: node i aggregates over the edges (i, j) at edge_index[0].
FAKE_SOLVERS = '''
import torch


def fwd_solver(f, z_init, threshold, max_iter):
    z = f(z_init)
    change = float("inf")
    for _ in range(max_iter):
        z, previous = f(z), z
        change = torch.linalg.vector_norm(z - previous).item()
        if change < threshold:
            break
    return z, change
'''
FAKE_LAYERS = '''
import torch
import torch.nn as nn
from torch_scatter import scatter_add

from src.solvers import *


class ImplicitFunc_Neural(nn.Module):
    def __init__(self, in_channels, out_channels, mu, epsilon=1e-6):
        super().__init__()
        self.mu, self.epsilon = mu, epsilon
        self.Theta_chi = nn.Linear(in_channels, out_channels, bias=False)
        self.Theta_phi = nn.Linear(out_channels, out_channels, bias=False)
        self.Theta_varphi = nn.Linear(in_channels, out_channels, bias=False)

    def forward(self, x, z, edge_index, edge_weight=None):
        i, j = edge_index
        n = x.size(0)
        deg = scatter_add(torch.ones(i.numel()), i, dim=0, dim_size=n)
        c = self.Theta_chi(x)
        p = self.Theta_phi(c)
        q = self.Theta_varphi(x)
        chi = deg * torch.tanh(c.norm(dim=1))
        phi = torch.tanh((p[i] * p[j]).sum(dim=1).abs())
        varphi_sq = torch.tanh(1 / ((q[i] - q[j]).norm(dim=1) + self.epsilon))
        weight = (phi * varphi_sq / chi[i]).unsqueeze(1)
        return x - scatter_add(weight * (z[i] - z[j]), i, dim=0, dim_size=n) / self.mu


class DEQFixedPoint(nn.Module):
    def __init__(self, func, fw_solver, bw_solver, max_iter, threshold, **kwargs):
        super().__init__()
        self.func, self.fw_solver, self.bw_solver = func, fw_solver, bw_solver
        self.max_iter, self.threshold = max_iter, threshold

    def forward(self, x, edge_index, edge_weight=None):
        with torch.no_grad():
            z, self.fw_res = self.fw_solver(lambda v: self.func(x, v, edge_index), x * 0,
                                            self.threshold, self.max_iter)
        out = self.func(x, z, edge_index)  # attaches x and the Thetas
        if self.training:
            at = z.detach().requires_grad_()
            again = self.func(x, at, edge_index)

            def implicit(g):
                handle.remove()
                torch.cuda.synchronize()  # as the authors' hook does: raises without a GPU
                u, self.backward_res = self.bw_solver(
                    lambda v: torch.autograd.grad(again, at, v, retain_graph=True)[0] + g,
                    g * 0, self.threshold, self.max_iter)
                return u
            handle = out.register_hook(implicit)
        return out
'''


@pytest.fixture(scope="module")
def fake_authors(tmp_path_factory):
    root = tmp_path_factory.mktemp("fake_authors_checkout")
    src = root / "nodeclassification" / "src"
    src.mkdir(parents=True)
    (src / "solvers.py").write_text(textwrap.dedent(FAKE_SOLVERS))
    (src / "layers.py").write_text(textwrap.dedent(FAKE_LAYERS))
    (root / ".commit").write_text("0123abcd\n")
    return root


@pytest.fixture(scope="module")
def tiny_graph():
    edge_index, n, directed = peers.load_graph(TINY)
    assert directed
    return edge_index, n


def _errors(result):
    return {k: result["accuracy"][k] for k in peers.ERROR_KEYS}


def test_every_peer_agrees_with_the_dense_float64_solve(tiny_graph, fake_authors):
    edge_index, n = tiny_graph
    names = peers.peer_names("cpu")
    assert {"dignn-cpu", "dignn-torch", "authors", "pyg-plain"} <= set(names)
    assert "dignn-triton" not in names  # not a CPU backend: never under the interpreter here
    sentinel = object()
    sys.modules["src"] = sentinel  # someone else's `src` package must survive the import
    try:
        out = peers.measure("tiny", edge_index, n, names, passes=("accuracy",),
                            authors_path=fake_authors, log=lambda s: None)
        assert sys.modules["src"] is sentinel
    finally:
        del sys.modules["src"]
    assert out["graph"]["oracle"].startswith("dense float64")
    assert out["graph"]["oracle_residual"] < 1e-12
    by_peer = {r["peer"]: r for r in out["results"]}
    for name in names:
        r = by_peer[name]
        if _absent_torchdeq(r):
            continue
        assert r["status"] == "ok", (name, r["status"])
        assert r["accuracy"]["converged"] is True, name
        worst = max(_errors(r).values())
        assert worst < 1e-5, (name, _errors(r))  # float32 against the float64 solve
        apps = r["accuracy"]["applications"]
        assert apps["forward"] >= 2 and apps["adjoint"] >= 2, (name, apps)
    info = peers.load_authors(fake_authors).info
    assert info["commit"] == "0123abcd"
    assert info["cuda_synchronize"] in ("no-op on the CPU", "torch.cuda.synchronize "
                                        "(CUDA available)")
    for dep in ("torch_scatter", "torch_sparse"):
        expect = "real" if importlib.util.find_spec(dep) else "stand-in"
        assert info["stand_ins"][dep].startswith(expect)
        if expect == "stand-in":
            assert dep not in sys.modules  # the stand-ins are not left behind


def test_this_layer_agrees_with_the_flipped_graph_too(tiny_graph):
    """Both ways of giving this layer the authors' direction: flow="target_to_source" where
    the layer has it, and edge_index.flip(0) in PyG's flow."""
    import inspect

    from dignn_kernels import FusedImplicitDiffusion
    has_flow = "flow" in inspect.signature(FusedImplicitDiffusion).parameters
    edge_index, n = tiny_graph
    for flow in (True, False):
        out = peers.measure("tiny", edge_index, n, ["dignn-cpu"], passes=("accuracy",),
                            dignn_flow=flow, log=lambda s: None)
        r = out["results"][0]
        assert r["status"] == "ok" and max(_errors(r).values()) < 1e-5, (flow, r)
        assert ("flip" in r["accuracy"]["settings"]["graph"]) == (not flow or not has_flow)


def test_the_float64_iteration_oracle_matches_the_dense_solve(tiny_graph):
    edge_index, n = tiny_graph
    gen = torch.Generator().manual_seed(3)
    x, g = torch.randn(n, 64, generator=gen), torch.randn(n, 64, generator=gen)
    thetas = [0.2 * torch.randn(64, 64, generator=gen) for _ in range(3)]
    dense = peers.oracle(x, edge_index.flip(0), thetas, g, dense=True)
    iterated = peers.oracle(x, edge_index.flip(0), thetas, g, dense=False, chunk=77)
    assert iterated["residual"] < 1e-12 and iterated["adjoint_residual"] < 1e-12
    assert peers._rel(iterated["z"], dense["z"]) < 1e-11
    for a, b in zip(iterated["grads"], dense["grads"]):
        assert peers._rel(a, b) < 1e-11


def test_timed_settings_count_the_map_applications(tiny_graph, fake_authors):
    edge_index, n = tiny_graph
    names = ["dignn-cpu", "authors", "pyg-plain"]
    out = peers.measure("tiny", edge_index, n, names, passes=("time",), rounds=2,
                        authors_path=fake_authors, log=lambda s: None)
    by_peer = {r["peer"]: r["time"] for r in out["results"]}
    assert by_peer["dignn-cpu"]["applications_forward"] == peers.K_TIMED
    assert by_peer["dignn-cpu"]["applications_adjoint"] == peers.K_TIMED
    assert by_peer["pyg-plain"]["applications_forward"] == peers.K_TIMED
    k = peers.AUTHORS_TIMED_MAX_ITER  # their loop: k + 2 forward (+ the graph of the VJP)
    assert by_peer["authors"]["applications_forward"] == k + 3
    assert by_peer["authors"]["applications_adjoint"] == k + 1
    for t in by_peer.values():
        assert len(t["rounds_ms"]) == 2 and t["median_ms"] > 0


def test_json_schema_and_summary(tmp_path, fake_authors):
    out = tmp_path / "peers_cpu.json"
    doc = peers.main(["--graphs", TINY, "--peers", "dignn-cpu,authors,torchdeq-anderson",
                      "--authors", str(fake_authors), "--rounds", "1", "--threads", "1",
                      "--out", str(out)])
    on_disk = json.loads(out.read_text())
    assert on_disk["summary"] == doc["summary"]
    for key in ("schema", "command", "commit", "date", "machine", "versions", "authors",
                "settings", "graphs", "results", "summary"):
        assert key in on_disk, key
    assert on_disk["schema"] == "dignn-peers/2"
    assert set(on_disk["machine"]) == {"cpu", "threads", "device"}
    assert set(on_disk["versions"]) >= {"torch", "torch_geometric", "torchdeq", "numpy"}
    assert set(on_disk["authors"]) >= {"path", "commit", "stand_ins", "cuda_synchronize"}
    graph = on_disk["graphs"][TINY]
    assert set(graph) >= {"nodes", "edges", "directed", "oracle", "oracle_residual"}
    assert graph["directed"] is True
    for r in on_disk["results"]:
        if _absent_torchdeq(r):
            continue
        assert r["status"] == "ok", r
        assert set(r["accuracy"]) >= set(peers.ERROR_KEYS) | {"applications", "converged",
                                                              "settings"}
        assert set(r["time"]) >= {"median_ms", "rounds_ms", "applications_forward",
                                  "applications_adjoint"}
        assert r["memory"]["peak_bytes"] > 0 and "profiler" in r["memory"]["method"]
        assert r["memory"]["peak_bytes"] == (r["memory"]["step_peak_bytes"] +
                                             r["memory"]["cached_bytes"])
        runs = r["tolerance"]["runs"]
        assert runs and all(run["status"] == "ok" or run["status"].startswith("not run")
                            for run in runs), runs
    assert graph["product"]["used"] == graph["product"]["fastest"]
    assert set(graph["product"]["candidates"]) == set(peers.PRODUCT_CANDIDATES)
    assert any(line.startswith(f"{TINY}: to relative residual 1e-06") for line in
               on_disk["summary"])
    assert any(line.startswith(f"{TINY}: this layer's fastest backend dignn-cpu")
               for line in on_disk["summary"])
    assert not list(tmp_path.glob("*.tmp"))


def test_write_json_is_atomic(tmp_path):
    path = tmp_path / "out.json"
    peers.write_json({"a": 1}, path)
    with pytest.raises(TypeError):  # fails half-way through the dump
        peers.write_json({"b": [1, 2, object()]}, path)
    assert json.loads(path.read_text()) == {"a": 1}  # the earlier file is intact
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left


def test_budget_skips_what_was_not_started(tmp_path):
    out = tmp_path / "p.json"
    doc = peers.main(["--graphs", f"{TINY},random-40-100", "--peers", "dignn-cpu,pyg-plain",
                      "--budget-s", "0", "--out", str(out)])
    assert [r["status"] for r in doc["results"]] == ["skipped: budget"] * 4
    assert json.loads(out.read_text())["results"] == doc["results"]


def test_budget_inside_a_graph(tiny_graph):
    edge_index, n = tiny_graph
    out = peers.measure("tiny", edge_index, n, ["dignn-cpu", "pyg-plain"],
                        passes=("accuracy", "memory", "time"), budget_s=0.0,
                        log=lambda s: None)
    assert out["graph"]["oracle"] == "not computed: budget"
    assert [r["status"] for r in out["results"]] == ["skipped: budget"] * 2


def test_absent_torchdeq_is_recorded(tiny_graph, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchdeq", None)  # its import raises ImportError
    edge_index, n = tiny_graph
    out = peers.measure("tiny", edge_index, n, ["torchdeq-fixed_point", "dignn-cpu"],
                        passes=("accuracy", "time"), rounds=1, log=lambda s: None)
    deq, ours = out["results"]
    assert deq["status"].startswith("absent: torchdeq not importable")
    assert ours["status"] == "ok"
    doc = {"results": [dict(r, graph="cornell5") for r in out["results"]]}
    assert any("torchdeq" in line and "not measured" in line for line in peers.summarize(doc))


def test_memory_method_measures_known_allocations():
    hundred_mb = 100_000_000
    assert peers.cpu_peak_bytes(lambda: torch.ones(hundred_mb // 4)) >= hundred_mb
    assert peers.cpu_peak_bytes(lambda: None) < 1_000_000

    def twice():  # two 100 MB tensors one after the other: the peak is one of them
        for _ in range(2):
            t = torch.ones(hundred_mb // 4)
            del t
    assert hundred_mb <= peers.cpu_peak_bytes(twice) < 1.5 * hundred_mb


def test_goals_in_the_summary():
    def row(peer, ms, peak, err=1e-7):
        acc = {k: err for k in peers.ERROR_KEYS}
        acc["converged"] = True
        return {"graph": "cornell5", "peer": peer, "status": "ok", "accuracy": acc,
                "time": {"median_ms": ms}, "memory": {"peak_bytes": peak}}
    doc = {"results": [row("dignn-cpu", 10.0, 100), row("authors", 300.0, 1000),
                       row("torchdeq-anderson", 50.0, 500, err=2e-5),
                       {"graph": "cornell5", "peer": "torchdeq-fixed_point",
                        "status": "failed: boom"}]}
    lines = peers.summarize(doc)
    text = "\n".join(lines)
    assert "20x faster than the authors' layer: met (30.00x" in text
    assert "4x faster than torchdeq's faster solver: met (5.00x" in text
    assert "less peak memory than the authors' layer: MISSED (10.00x" in text
    assert "MISSED (torchdeq-anderson 2.0e-05)" in text
    assert "  torchdeq-fixed_point: failed: boom" in lines


def test_stand_ins_match_pyg():
    from torch_geometric.utils import coalesce, scatter
    gen = torch.Generator().manual_seed(0)
    src, index = torch.randn(30, 4, generator=gen), torch.randint(0, 7, (30,), generator=gen)
    assert torch.allclose(scatter_stand_in.scatter_add(src, index, dim=0, dim_size=9),
                          scatter(src, index, 0, dim_size=9, reduce="sum"))
    for reduce in ("mean", "max", "min"):
        assert torch.allclose(scatter_stand_in.scatter(src, index, 0, dim_size=7, reduce=reduce),
                              scatter(src, index, 0, dim_size=7, reduce=reduce))
    ei = torch.randint(0, 6, (2, 40), generator=gen)
    value = torch.randn(40, generator=gen)
    got = sparse_stand_in.coalesce(ei, value, 6, 6, op="add")
    want = coalesce(ei, value, 6, reduce="sum")
    assert torch.equal(got[0], want[0]) and torch.allclose(got[1], want[1])
    dense = sparse_stand_in.SparseTensor(row=ei[0], col=ei[1], value=value,
                                         sparse_sizes=(6, 6)).to_torch_sparse_coo_tensor()
    assert torch.allclose(dense.to_dense(), torch.zeros(6, 6).index_put(
        (ei[0], ei[1]), value, accumulate=True))


@pytest.mark.skipif(not os.environ.get("DIGNN_AUTHORS"),
                    reason="set DIGNN_AUTHORS to a checkout of github.com/guoji-fu/DIGNN")
def test_the_authors_code_agrees(tiny_graph):
    edge_index, n = tiny_graph
    out = peers.measure("tiny", edge_index, n, ["authors"], passes=("accuracy", "time"),
                        rounds=1, authors_path=os.environ["DIGNN_AUTHORS"], log=lambda s: None)
    r = out["results"][0]
    assert r["status"] == "ok", r["status"]
    assert r["accuracy"]["converged"] is True
    assert max(_errors(r).values()) < 1e-5, _errors(r)
    k = peers.AUTHORS_TIMED_MAX_ITER
    assert (r["time"]["applications_forward"], r["time"]["applications_adjoint"]) == (k + 3,
                                                                                       k + 1)


def _undirected(edge_index):
    return torch.cat([edge_index, edge_index.flip(0)], dim=1)


def test_every_peer_to_the_tolerance(tiny_graph, fake_authors):
    """The tolerance pass: every peer (this layer with each solver) reaches relative residual
    1e-6 of the equation and of its adjoint, as measured alike for all, with its iterations
    and forward and backward times; cg runs on the undirected graph and is recorded as not
    run on the directed one."""
    edge_index, n = tiny_graph
    names = peers.peer_names("cpu")
    for graph, directed in ((edge_index, True), (_undirected(edge_index), False)):
        out = peers.measure("tiny", graph, n, names, passes=("tolerance",), rounds=1,
                            authors_path=fake_authors, log=lambda s: None)
        assert out["graph"]["tolerance"]["target"] == peers.TOLERANCE
        for r in out["results"]:
            if _absent_torchdeq(r):
                continue
            assert r["status"] == "ok", r
            if r["peer"] == "dignn-torch":
                assert r["tolerance"]["status"].startswith("not run")
                continue
            runs = {run["solver"]: run for run in r["tolerance"]["runs"]}
            if r["peer"] == "dignn-cpu":
                assert set(runs) == set(peers.TOLERANCE_SOLVERS)
                if directed:
                    assert runs.pop("cg")["status"].startswith("not run: a directed graph")
            for solver, run in runs.items():
                assert run["status"] == "ok", (r["peer"], solver, run)
                assert run["reached"], (r["peer"], solver, run)
                assert run["residual_forward"] <= peers.TOLERANCE
                assert run["residual_adjoint"] <= peers.TOLERANCE
                assert run["iterations_forward"] >= 2 and run["iterations_adjoint"] >= 2
                assert run["forward_ms"] > 0 and run["backward_ms"] > 0
                assert len(run["rounds_forward_ms"]) == 1


def test_the_adjoint_each_peer_hands_back_is_the_dense_solve(tiny_graph, fake_authors):
    """What the tolerance pass measures the adjoint residual of: the gradient that reaches
    the equation's right-hand side, u = (I + Delta^T/mu)^-1 G, for every peer."""
    from dignn_kernels import reference
    edge_index, n = tiny_graph
    gen = torch.Generator().manual_seed(peers.SEED)
    x = torch.randn(n, peers.CHANNELS, generator=gen)
    g = torch.randn(n, peers.CHANNELS, generator=gen)
    torch.manual_seed(peers.SEED)
    from dignn_kernels import FusedImplicitDiffusion
    base = FusedImplicitDiffusion(peers.CHANNELS, mu=peers.MU, eps=peers.EPS)
    thetas = [base.theta_chi.weight, base.theta_phi.weight, base.theta_varphi.weight]
    _, delta = reference.dense_equilibrium(
        x.double(), edge_index.flip(0), mu=peers.MU, eps=peers.EPS,
        **{k: t.detach().double() for k, t in zip(
            ("theta_chi", "theta_phi", "theta_varphi"), thetas)})
    u = torch.linalg.solve(torch.eye(n, dtype=torch.float64) + delta.T.detach() / peers.MU,
                           g.double())
    ops = peers.delta64(x, edge_index.flip(0), thetas)
    assert peers.relative_residuals(ops, x, x, g, u)[1] < 1e-12
    ctx = {"device": "cpu", "edge_index": edge_index, "edge_index_pyg": edge_index.flip(0),
           "num_nodes": n, "x_norm": float(x.norm()), "g_norm": float(g.norm())}
    names = [p for p in peers.peer_names("cpu") if p != "dignn-torch"]
    if not HAVE_TORCHDEQ:
        names = [p for p in names if not p.startswith("torchdeq-")]
    for name in names:
        peer = peers.make_peer(name, base, ctx, "tolerance", fake_authors)
        if isinstance(peer, peers.PygPlainPeer):
            peer.calibrate(x)
        with peer.grabbing() as grab:
            peers._train_step(peer, x.clone().requires_grad_(), g)
        assert grab.grad is not None, name
        assert peers._rel(grab.grad, u) < 1e-5, (name, peers._rel(grab.grad, u))


def test_products_agree_and_the_product_pass_records_them(tiny_graph):
    edge_index, n = tiny_graph
    for product in peers.PRODUCTS:
        out = peers.measure("tiny", edge_index, n, ["pyg-plain"], passes=("accuracy",),
                            product=product, log=lambda s: None)
        r = out["results"][0]
        assert r["status"] == "ok" and max(_errors(r).values()) < 1e-5, (product, r)
        assert r["accuracy"]["settings"]["product"].startswith(product + ":")
        assert out["graph"]["product"]["used"] == product
    out = peers.measure("tiny", edge_index, n, ["pyg-plain"], passes=("product", "time"),
                        rounds=1, log=lambda s: None)
    product = out["graph"]["product"]
    assert set(product["candidates"]) == set(peers.PRODUCT_CANDIDATES)
    for c, entry in product["candidates"].items():
        assert entry["status"] == "ok" and entry["median_ms"] > 0, (c, entry)
        assert entry["step_peak_bytes"] > 0
    fastest = min(product["candidates"], key=lambda c: product["candidates"][c]["median_ms"])
    assert product["fastest"] == product["used"] == fastest
    assert out["results"][0]["time"]["settings"]["product"].startswith(fastest + ":")
    assert "torch_sparse" in product


def test_memory_counts_every_cached_structure(tiny_graph):
    from dignn_kernels import build_graph
    edge_index, n = tiny_graph
    out = peers.measure("tiny", edge_index, n, ["dignn-cpu", "pyg-plain"], passes=("memory",),
                        log=lambda s: None)
    ours, pyg = (r["memory"] for r in out["results"])
    built = build_graph(edge_index, n, flow="target_to_source")
    csr = sum(t.untyped_storage().nbytes() for t in (built.rowptr, built.col, built.value,
                                                      built.degree))
    assert ours["cached_bytes"] >= csr
    assert any(k.startswith("graph cache") and v > 0 for k, v in ours["cached"].items())
    assert pyg["cached_bytes"] >= edge_index.size(1) * 8  # the coalesced edges at least
    for mem in (ours, pyg):
        assert mem["peak_bytes"] == mem["step_peak_bytes"] + mem["cached_bytes"]
    t = torch.ones(1000)
    assert peers.tensor_bytes({"a": [t, t.view(10, 100)], "b": {"again": t[5:]}}) == {
        "a": 4000, "b": 0}  # a storage counts once, in the first group that holds it
