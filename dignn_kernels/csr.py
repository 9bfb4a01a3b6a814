"""CSR index utilities shared by the ops' Python face and the graph preprocessing: the row of
every entry, the transpose, the diagonal. Device ops only (no host sync)."""
from typing import Tuple

import torch
from torch import Tensor

__all__ = ["csr_rows", "rowptr_from_sorted_rows", "transpose_csr", "diagonal_index"]


def rowptr_from_sorted_rows(rows: Tensor, n: int) -> Tensor:
    """The rowptr (n + 1 offsets) of a CSR whose entries have the sorted row indices `rows`."""
    counts = torch.bincount(rows, minlength=n) if rows.numel() else rows.new_zeros(n)
    # a cat, not cumsum(out=rowptr[1:]): under torch.compile with dynamic shapes bincount's
    # length is data-dependent, and Inductor of torch 2.11 fails to write it into a slice of
    # length n (the backward of neural_edge_weights builds the transpose with this)
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)]).to(torch.int64)


def csr_rows(rowptr: Tensor, num_edges: int) -> Tensor:
    """The row of every CSR entry (the COO row index), with device ops only."""
    n = rowptr.numel() - 1
    return torch.repeat_interleave(torch.arange(n, device=rowptr.device),
                                   rowptr[1:] - rowptr[:-1], output_size=num_edges)


def transpose_csr(rowptr: Tensor, col: Tensor, n: int) -> Tuple[Tensor, Tensor, Tensor]:
    """The CSR of the transpose: (t_rowptr, t_col, t_perm), where entry k of the transpose is
    entry t_perm[k] of the original (so transposed values are ``values[t_perm]``)."""
    rows = csr_rows(rowptr, col.numel())
    perm = torch.argsort(col.long() * max(n, 1) + rows, stable=True)
    t_rowptr = rowptr_from_sorted_rows(col.long()[perm], n)
    t_col = rows[perm].to(col.dtype)
    return t_rowptr, t_col, perm


def diagonal_index(rowptr: Tensor, col: Tensor) -> Tensor:
    """For each row i of a coalesced CSR, the position of entry (i, i), or -1; with device
    ops only (no host read of how many self-loops there are)."""
    n, m = rowptr.numel() - 1, col.numel()
    rows = csr_rows(rowptr, m)
    position = torch.where(rows == col.long(), torch.arange(m, device=rowptr.device), m)
    index = torch.full((n,), m, dtype=torch.int64, device=rowptr.device)
    index.scatter_reduce_(0, rows, position, "amin")
    return torch.where(index == m, -1, index)
