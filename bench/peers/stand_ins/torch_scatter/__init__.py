"""Stand-in for ``torch_scatter``, written for this project over plain PyTorch, so that
the benchmark harness (bench/peers/peers.py) can import the DIGNN authors' node-classification
code on machines where the real package cannot be installed. The harness uses the real
package whenever it imports.

It covers what that code calls: ``scatter_add(src, index, dim=-1, out=None,
dim_size=None)`` and ``scatter(src, index, dim=-1, out=None, dim_size=None,
reduce="sum")`` with reduce one of sum/add, mean, mul, min, max (a 1-D ``index`` is
broadcast along ``dim`` as torch_scatter does; empty groups give 0).
"""
from typing import Optional

import torch
from torch import Tensor

__all__ = ["scatter", "scatter_add"]

_REDUCE = {"sum": "sum", "add": "sum", "mean": "mean", "mul": "prod", "min": "amin",
           "max": "amax"}


def _broadcast(index: Tensor, src: Tensor, dim: int) -> Tensor:
    if index.dim() == 1:
        shape = [1] * src.dim()
        shape[dim] = -1
        index = index.view(shape)
    return index.expand_as(src)


def scatter(src: Tensor, index: Tensor, dim: int = -1, out: Optional[Tensor] = None,
            dim_size: Optional[int] = None, reduce: str = "sum") -> Tensor:
    """Reduces ``src`` into the slots ``index`` names along ``dim``."""
    if reduce not in _REDUCE:
        raise ValueError(f"reduce must be one of {sorted(_REDUCE)}, got {reduce!r}")
    dim = dim + src.dim() if dim < 0 else dim
    index = _broadcast(index.long(), src, dim)
    if out is None:
        size = list(src.shape)
        size[dim] = dim_size if dim_size is not None else (
            int(index.max()) + 1 if index.numel() else 0)
        out = src.new_zeros(size)
        include_self = False
    else:
        include_self = True
    if _REDUCE[reduce] == "sum":
        return out.scatter_add(dim, index, src)
    return out.scatter_reduce(dim, index, src, _REDUCE[reduce], include_self=include_self)


def scatter_add(src: Tensor, index: Tensor, dim: int = -1, out: Optional[Tensor] = None,
                dim_size: Optional[int] = None) -> Tensor:
    """Sums ``src`` into the slots ``index`` names along ``dim``."""
    return scatter(src, index, dim, out, dim_size, reduce="sum")
