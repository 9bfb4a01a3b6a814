"""One backend's passes through the public face (:mod:`dignn_kernels.ops` with ``backend=``)
and its fixed-point solve through the solve entry: what the tests call per backend; and the
inputs of one layer on a test graph that the backends' tests share."""
from functools import partial
from types import SimpleNamespace

import torch

import dignn_kernels as dk
from dignn_kernels import ops
from conftest import make_graph


def hub_graph(n=80, seed=0):
    """A symmetric graph whose node 0 is joined to nodes 1 .. n - 4 (degree 76 for n = 80,
    more than the default SEGMENT_EDGES), plus a sparse random part; the last 3 nodes are
    isolated."""
    g = torch.Generator().manual_seed(seed)
    others = torch.arange(1, n - 3)
    e = torch.randint(1, n - 3, (2, n), generator=g)
    e = e[:, e[0] != e[1]]
    star = torch.stack([torch.zeros_like(others), others])
    ei = torch.cat([star, e], dim=1)
    return torch.cat([ei, ei.flip(0)], dim=1)


def graph_inputs(kind="symmetric", n=20, d=5, h=4, dtype=torch.float64, seed=0):
    """(graph, x, p, q, a, chi) on the CPU; kinds of conftest.make_graph plus 'hub'
    (:func:`hub_graph`); 'zero_rows' guards every fifth row (chi = 0)."""
    if kind == "hub":
        ei, w = hub_graph(n, seed), None
        x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    else:
        x, ei, w = make_graph(kind, n=n, d=d, dtype=dtype, seed=seed)
    g = dk.build_graph(ei, x.size(0), w)
    gen = torch.Generator().manual_seed(seed + 1)
    p = 0.5 * torch.randn(x.size(0), h, generator=gen, dtype=dtype)
    q = 0.5 * torch.randn(x.size(0), h, generator=gen, dtype=dtype)
    a, deg = g.values(dtype)
    chi = deg * torch.tanh(p.norm(dim=1))
    if kind == "zero_rows":
        chi[::5] = 0.0  # the guard
    return g, x, p, q, a, chi


def face(backend: str) -> SimpleNamespace:
    def implicit_diffusion(*args, **kwargs):
        kwargs.setdefault("solver", "fixed_point")
        return dk.implicit_diffusion(*args, backend=backend, **kwargs)

    is_compiled = backend in ("cpu", "cuda")  # the ops themselves (the dispatcher's choice)
    extra = {"neural_edge_weights_backward": ops.neural_edge_weights_backward} \
        if is_compiled else {}
    passes = {name: partial(getattr(ops, name), backend=None if is_compiled else backend)
              for name in ("neural_edge_weights", "csr_fma", "neural_weight_grad",
                           "diffusion_step")}
    return SimpleNamespace(name=backend, implicit_diffusion=implicit_diffusion,
                           backward_stats=dk.backward_stats, **passes, **extra)
