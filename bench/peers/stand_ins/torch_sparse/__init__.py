"""Stand-in for ``torch_sparse``, written for this project over plain PyTorch, so that
the benchmark harness (bench/peers/peers.py) can import the DIGNN authors' node-classification
code on machines where the real package cannot be installed. The harness uses the real
package whenever it imports.

It covers what that code calls: ``SparseTensor(row=, col=, value=None, sparse_sizes=)``
with ``.to_torch_sparse_coo_tensor()``, and ``coalesce(index, value, m, n, op="add")``
(duplicates merged by sum/add, mean, min or max, entries sorted row-major).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["SparseTensor", "coalesce"]


class SparseTensor:
    """A COO matrix of ``row``, ``col`` and ``value`` (ones when None)."""

    def __init__(self, row: Tensor, col: Tensor, value: Optional[Tensor] = None,
                 sparse_sizes: Optional[Tuple[int, int]] = None):
        self.row, self.col, self.value = row.long(), col.long(), value
        if sparse_sizes is None or None in tuple(sparse_sizes):
            m = int(self.row.max()) + 1 if self.row.numel() else 0
            k = int(self.col.max()) + 1 if self.col.numel() else 0
            given = tuple(sparse_sizes) if sparse_sizes is not None else (None, None)
            sparse_sizes = (given[0] if given[0] is not None else m,
                            given[1] if given[1] is not None else k)
        self._sizes = (int(sparse_sizes[0]), int(sparse_sizes[1]))

    def sparse_sizes(self) -> Tuple[int, int]:
        """(rows, columns)."""
        return self._sizes

    def to_torch_sparse_coo_tensor(self) -> Tensor:
        """The matrix as a torch sparse COO tensor (duplicates summed)."""
        value = self.value if self.value is not None else torch.ones(
            self.row.numel(), device=self.row.device)
        index = torch.stack([self.row, self.col])
        return torch.sparse_coo_tensor(index, value, self._sizes).coalesce()


def coalesce(index: Tensor, value: Optional[Tensor], m: int, n: int,
             op: str = "add") -> Tuple[Tensor, Optional[Tensor]]:
    """Sorts the entries ``index`` [2, nnz] of an m x n matrix row-major and merges
    duplicates, their values reduced by ``op``; returns (index, value)."""
    reduce = {"add": "sum", "sum": "sum", "mean": "mean", "min": "amin", "max": "amax"}
    if op not in reduce:
        raise ValueError(f"op must be one of {sorted(reduce)}, got {op!r}")
    key = index[0].long() * n + index[1].long()
    unique, inverse = torch.unique(key, sorted=True, return_inverse=True)
    out_index = torch.stack([unique // n, unique % n])
    if value is None:
        return out_index, None
    size = (unique.numel(),) + tuple(value.shape[1:])
    idx = inverse.view(-1, *([1] * (value.dim() - 1))).expand_as(value)
    out = value.new_zeros(size).scatter_reduce(0, idx, value, reduce[op], include_self=False)
    return out_index, out
