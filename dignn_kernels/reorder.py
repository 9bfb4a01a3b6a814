"""Node orders that put neighbours near each other in memory (locality reordering).

Every sweep of the solvers gathers the rows z_j of a node's neighbours (the row pass,
:mod:`dignn_kernels.backends.interface`). When neighbour ids are far apart those gathers hit
a different cache line, page and, once Z outgrows the cache, a different DRAM burst each; on
an H100 one layer step on a products-sized block model took 361 ms with shuffled ids and 177
ms with block-ordered ids (bench/results/gpu_h100_2026-11-23/locality_products_block_model
.json). Renumbering the nodes changes nothing in the math: Delta is permuted symmetrically,
P Delta P^T, and the equilibrium of P X is P Z.

Orders (``order[k]`` is the original id of the node placed at position k):

- ``"rcm"``: reverse Cuthill-McKee (scipy, on the structure of A + A^T): a breadth-first
  order that keeps every node's neighbours in a narrow band of ids;
- ``"degree"``: by decreasing degree (ties by id), so the hubs that most rows read share the
  first cache lines;
- ``"community"``: label propagation groups densely connected nodes (a few synchronous rounds
  on a random half of the nodes each, on the device), and each group gets contiguous ids in
  the order of its first member;
- ``"auto"``: whichever of these has the lowest :func:`locality_cost`, and no renumbering
  when none beats the given order by :data:`AUTO_MIN_GAIN`;
- ``"none"``: the given order.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from .csr import csr_rows

__all__ = ["REORDERINGS", "AUTO_MIN_GAIN", "node_order", "locality_cost", "inverse_order",
           "check_reorder"]

REORDERINGS = ("none", "auto", "rcm", "degree", "community")
# "auto" renumbers only when the best order lowers the locality cost by this fraction.
AUTO_MIN_GAIN = 0.10
_LABEL_ROUNDS = 12


def check_reorder(reorder) -> str:
    """``reorder`` as one of :data:`REORDERINGS` (None is ``"none"``), or a ValueError."""
    if reorder is None:
        return "none"
    if reorder not in REORDERINGS:
        raise ValueError(f"reorder must be one of {REORDERINGS} (or None for 'none'), got "
                         f"{reorder!r}")
    return reorder


def inverse_order(order: Tensor) -> Tensor:
    """``position`` with ``position[order[k]] = k``: where each original node went."""
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel(), device=order.device)
    return position


def locality_cost(rowptr: Tensor, col: Tensor, order: Optional[Tensor] = None) -> float:
    """The mean over CSR entries (i, j) of log2(1 + |pos(i) - pos(j)|), ``pos`` the position
    of a node in ``order`` (None: the CSR's own ids): about the number of address bits that
    separate a row from the neighbour rows it gathers, so lower means more of the gathers hit
    lines and pages already in cache. 0 for a graph without edges."""
    m = col.numel()
    if m == 0:
        return 0.0
    rows = csr_rows(rowptr, m)
    cols = col.long()
    if order is not None:
        position = inverse_order(order)
        rows, cols = position[rows], position[cols]
    return float(torch.log2(1.0 + (rows - cols).abs().double()).mean())


def _symmetric_structure(rowptr: Tensor, col: Tensor, n: int):
    """(rows, cols) of A + A^T without self-loops (duplicates kept: they only weigh)."""
    rows = csr_rows(rowptr, col.numel())
    cols = col.long()
    keep = rows != cols
    rows, cols = rows[keep], cols[keep]
    return torch.cat([rows, cols]), torch.cat([cols, rows])


def _rcm(rowptr: Tensor, col: Tensor, n: int) -> Tensor:
    import numpy as np
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    rp = rowptr.cpu().numpy()
    cl = col.cpu().numpy().astype(np.int32 if n < 2**31 else np.int64, copy=False)
    structure = csr_matrix((np.ones(cl.shape[0], dtype=np.int8), cl, rp), shape=(n, n))
    order = reverse_cuthill_mckee(structure, symmetric_mode=False)
    return torch.from_numpy(order.astype(np.int64)).to(rowptr.device)


def _degree(rowptr: Tensor, col: Tensor, n: int) -> Tensor:
    rows, _ = _symmetric_structure(rowptr, col, n)
    degree = torch.bincount(rows, minlength=n)
    return torch.sort(degree, descending=True, stable=True).indices


def _community(rowptr: Tensor, col: Tensor, n: int, seed: int = 0) -> Tensor:
    rows, cols = _symmetric_structure(rowptr, col, n)
    device = rowptr.device
    labels = torch.arange(n, device=device)
    has_edges = torch.zeros(n, dtype=torch.bool, device=device)
    has_edges[rows] = True
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(_LABEL_ROUNDS):
        # the most frequent label among each node's neighbours, the smallest on ties
        key, counts = torch.unique(rows * n + labels[cols], return_counts=True)
        row, label = key // n, key % n
        best = torch.zeros(n, dtype=counts.dtype, device=device).scatter_reduce(
            0, row, counts, "amax", include_self=False)
        candidate = torch.where(counts == best[row], label, torch.full_like(label, n))
        new = torch.full((n,), n, dtype=labels.dtype, device=device).scatter_reduce(
            0, row, candidate, "amin", include_self=True)
        # a random half moves each round: synchronous rounds alone oscillate between sides
        moving = (torch.rand(n, generator=gen) < 0.5).to(device) & has_edges
        changed = moving & (new != labels)
        if not bool(changed.any()):
            break
        labels = torch.where(changed, new, labels)
    # groups in the order of their first member, members in id order
    first = torch.full((n,), n, dtype=labels.dtype, device=device).scatter_reduce(
        0, labels, torch.arange(n, device=device), "amin", include_self=True)
    return torch.sort(first[labels] * n + torch.arange(n, device=device)).indices


_ORDERS = {"rcm": _rcm, "degree": _degree, "community": _community}


def node_order(rowptr: Tensor, col: Tensor, num_nodes: int, reorder: str
               ) -> Tuple[Optional[Tensor], str]:
    """(order, method): the order ``reorder`` gives the nodes of a square CSR (int64 [n],
    ``order[k]`` = the original id at position k, on the CSR's device) and the method that
    made it (what ``"auto"`` chose), or (None, "none") to keep the given ids."""
    reorder = check_reorder(reorder)
    if reorder == "none" or num_nodes < 2:
        return None, "none"
    if reorder != "auto":
        return _ORDERS[reorder](rowptr, col, num_nodes), reorder
    best, chosen, best_cost = None, "none", locality_cost(rowptr, col)
    threshold = best_cost * (1.0 - AUTO_MIN_GAIN)
    for method in ("rcm", "community", "degree"):
        order = _ORDERS[method](rowptr, col, num_nodes)
        cost = locality_cost(rowptr, col, order)
        if cost < threshold and (best is None or cost < best_cost):
            best, chosen, best_cost = order, method, cost
    return best, chosen
