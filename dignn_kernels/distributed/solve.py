"""The layer's solve on a partitioned graph, differentiable: the forward and adjoint solves of
:mod:`dignn_kernels.solvers` on a :class:`DistributedSystem`, with the backward formulas of
:mod:`dignn_kernels.solvers.op` (one statement of each).

Per forward: one exchange of the halo rows of p and q (neural Laplacian), then one exchange
per sweep. Per backward: the adjoint sweeps (reverse exchanges), one exchange of the halo rows
of Z for the gradient pass, and the reverse exchange of the halo rows' dl/dp, dl/dq (the
backward of the p, q exchange). The fixed point runs the solvers' loop over the backend's
passes: a backend's fused loop (the compiled C++ one) cannot exchange halos.

Autograd runs every rank's backward in the same order (the same layers, the same graph), so
the ranks meet in the same collectives; every rank must call forward and backward.
Not traceable by ``torch.compile`` (the collectives run in a Python autograd Function).
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch
from torch import Tensor

from ..backends import get_backend
from ..backends.registration import forward_ad_active
from ..solvers import op as solve_op
from ..solvers.loops import ANDERSON_WINDOW, solve_adjoint, solve_forward
from ..solvers.registry import get_solver
from .graph import DistributedGraph
from .system import DistributedSystem, _cat

__all__ = ["distributed_forward"]


def _system(graph: DistributedGraph, cfg: dict, edge_value: Tensor, chi: Tensor,
            p_full: Optional[Tensor], q_full: Optional[Tensor], kappa: Optional[Tensor],
            w: Optional[Tensor] = None):
    t_rowptr, t_col, t_perm = graph.transposed()
    diag_index = graph.diagonal_index() if get_solver(cfg["solver"]).spd else None
    local, w, kappa = solve_op._system(
        get_backend(cfg["backend"]), graph.rowptr, graph.col, edge_value, graph.pad(chi),
        p_full, q_full, kappa, cfg["mu"], cfg["eps"], t_rowptr, t_col, t_perm, diag_index,
        w=w, symmetric=graph.symmetric)
    return DistributedSystem(local, graph), w, kappa


def _solve_args(cfg: dict, device: torch.device) -> dict:
    solver = cfg["solver"]
    return dict(max_iter=cfg["max_iter"], tol=cfg["tol"], window=cfg["window"],
                check_every=solve_op._effective_check_every(cfg["check_every"], device, solver))


class _DistributedSolve(torch.autograd.Function):
    """(x, chi, p_full, q_full) -> (z, stats) on the owned rows; p_full and q_full hold the
    owned and halo rows (None for fixed weights, whose ``edge_value`` is W and ``kappa`` the
    padded diagonal of L)."""

    @staticmethod
    def forward(ctx, graph: DistributedGraph, cfg: dict, x: Tensor, chi: Tensor,
                p_full: Optional[Tensor], q_full: Optional[Tensor], edge_value: Tensor,
                kappa: Optional[Tensor]):
        system, w, kappa = _system(graph, cfg, edge_value, chi, p_full, q_full, kappa)
        out = solve_forward(system, x, cfg["solver"], **_solve_args(cfg, x.device))
        stats = out.stats()
        ctx.mark_non_differentiable(stats)
        ctx.save_for_backward(x, chi, p_full, q_full, edge_value, out.solution, w, kappa)
        ctx.graph, ctx.cfg = graph, cfg
        ctx.stats_key = weakref.ref(stats)
        return out.solution, stats

    @staticmethod
    def backward(ctx, grad_z: Tensor, grad_stats):
        if torch.is_grad_enabled():  # (create_graph=True: a second derivative was asked for)
            raise RuntimeError(
                "second derivatives (backward with create_graph=True, torch.autograd.grad of "
                "a gradient) are not supported on a DistributedGraph; the first-order backward "
                "is. Use the layer on a whole graph for higher derivatives")
        x, chi, p_full, q_full, edge_value, z, w, kappa = ctx.saved_tensors
        graph, cfg = ctx.graph, ctx.cfg
        neural = p_full is not None
        system, _, _ = _system(graph, cfg, edge_value, chi, p_full, q_full, kappa,
                               w=w if neural else None)
        if grad_z is None:
            grad_z = torch.zeros_like(z)
        out = solve_adjoint(system, grad_z.contiguous(), cfg["solver"],
                            **_solve_args(cfg, x.device))
        u = out.solution
        forward_stats = ctx.stats_key()
        if forward_stats is not None:
            solve_op._file_backward_stats(forward_stats, out.stats())
        grad_chi = solve_op.chi_gradient(u, x, z, system.rs, cfg["mu"])
        grad_p = grad_q = None
        if neural:
            t_rowptr, t_col, t_perm = graph.transposed()
            z_full = _cat(z, graph.exchange.gather(z))
            v = graph.pad(solve_op.edge_gradient_weights(u, system.rs))
            grad_p, grad_q = get_backend(cfg["backend"]).neural_weight_grad(
                graph.rowptr, graph.col, edge_value, p_full, q_full, z_full, v, cfg["eps"],
                t_rowptr, t_col, t_perm)
        return None, None, u, grad_chi, grad_p, grad_q, None, None


def distributed_forward(layer, x: Tensor, graph: DistributedGraph,
                        edge_weight: Optional[Tensor] = None) -> Tensor:
    """``layer(x, graph)`` for a :class:`DistributedGraph`: x holds this rank's owned rows
    (``x_global[graph.owned]``), the result the owned rows of Z."""
    if forward_ad_active() or torch._C._functorch.peek_interpreter_stack() is not None:
        raise RuntimeError(
            "forward-mode AD (torch.func.jvp, torch.autograd.forward_ad) and torch.func's "
            "transforms (grad, vmap, jacrev, ...) are not supported on a DistributedGraph: "
            "use reverse mode (loss.backward(), torch.autograd.grad), or the layer on a whole "
            "graph, which supports them")
    if edge_weight is not None:
        raise ValueError("edge_weight goes into the partition: pass it to partition(edge_index, "
                         "num_nodes, parts, edge_weight=...), not with a DistributedGraph")
    if layer.storage_dtype is not None:
        raise ValueError(f"storage_dtype={layer.storage_dtype} is not supported on a "
                         f"DistributedGraph yet: build the layer with storage_dtype=None for "
                         f"partitioned graphs")
    if layer.reorder != "none":
        raise ValueError(f"reorder={layer.reorder!r} renumbers a graph the layer builds; a "
                         f"DistributedGraph keeps its partition's order: build the layer with "
                         f"reorder='none' for partitioned graphs")
    host_checks = layer._check_x(x)
    if x.size(0) != graph.num_owned:
        raise ValueError(f"x has {x.size(0)} rows but rank {graph.rank} owns "
                         f"{graph.num_owned} nodes of the partitioned graph: pass the owned "
                         f"rows, x_global[graph.owned]")
    if x.device != graph.device:
        raise ValueError(f"x is on {x.device} but the DistributedGraph is on {graph.device}; "
                         f"build the graph with device={str(x.device)!r} or move x")
    backend = layer._resolve_backend(x.device, graph.num_edges)
    layer.backend_used = backend
    solver = layer._solver_for(graph.symmetric)
    layer.solver_used = solver
    compute = torch.float64 if torch.float64 in (x.dtype, layer._param_dtype()) else \
        torch.float32
    xc = x.to(compute)
    cfg = dict(mu=layer.mu, eps=layer.eps, max_iter=layer.max_iter, tol=layer.tol,
               solver=solver, backend=backend, window=ANDERSON_WINDOW,
               check_every=-1 if layer.check_every is None else layer.check_every)
    if layer.laplacian == "neural":
        a, degree = graph.values(compute)
        chi, p, q = layer._projections(xc, degree)
        h = p.size(1)
        pq_full = graph.with_halo(torch.cat([p, q], dim=1))  # one exchange for both
        z, stats = _DistributedSolve.apply(graph, cfg, xc, chi, pq_full[:, :h].contiguous(),
                                           pq_full[:, h:].contiguous(), a, None)
    else:
        w, chi, kappa = graph.fixed_laplacian(layer.laplacian, compute)
        z, stats = _DistributedSolve.apply(graph, cfg, xc, chi[: graph.num_owned], None, None,
                                           w, kappa)
    layer._stats = stats
    if host_checks:
        solve_op.warn_if_diverged(stats, solver, layer.mu, layer.tol)
    return z.to(x.dtype)
