"""Deterministic synthetic graphs for benchmarks and for runs that need no data files.

- :func:`penn94_like_graph`: the shape of facebook100's Penn94 (41,554 nodes, 1,362,229
  undirected edges, mean degree about 65.6, heavy-tailed degrees with hubs of thousands of
  neighbours next to nodes of one), whose graph file is not available offline.
- :func:`uniform_graph`: the same numbers of nodes and edges with near-uniform degrees, the
  control for degree-skew benchmarks.
- :func:`block_model_graph`: a stochastic block model (blocks of consecutive ids, most edges
  inside a block), optionally with shuffled ids: community structure that the ids hide, the
  case for locality reordering (:mod:`dignn_kernels.reorder`). Its default size is
  ogbn-products' (2,449,029 nodes, about 124M CSR entries).

Both return a symmetric ``edge_index`` (each undirected edge in both directions, no self-loops,
no duplicates) and are identical for the same arguments on every machine.
"""
import torch
from torch import Tensor

__all__ = ["penn94_like_graph", "uniform_graph", "block_model_graph", "degree_skew"]

PENN94_NODES = 41_554
PENN94_EDGES = 1_362_229  # undirected
PRODUCTS_NODES = 2_449_029
PRODUCTS_EDGES = 61_859_140  # undirected (123,718,280 CSR entries)


def _undirected_from_pairs(src: Tensor, dst: Tensor, n: int, num_edges: int,
                           gen: torch.Generator) -> Tensor:
    keep = src != dst
    lo, hi = torch.minimum(src[keep], dst[keep]), torch.maximum(src[keep], dst[keep])
    key = torch.unique(lo * n + hi)  # sorted, so the order below depends on the seed only
    if key.numel() < num_edges:
        raise RuntimeError(f"drew {key.numel()} distinct edges, fewer than {num_edges}; "
                           "raise the oversampling")
    key = key[torch.randperm(key.numel(), generator=gen)[:num_edges]]
    lo, hi = key // n, key % n
    return torch.stack([torch.cat([lo, hi]), torch.cat([hi, lo])])


def penn94_like_graph(num_nodes: int = PENN94_NODES, num_edges: int = PENN94_EDGES,
                      exponent: float = 2.6, seed: int = 0) -> Tensor:
    """A Chung-Lu graph whose expected degrees follow a power law (``exponent`` ~ 2.6, cut
    so that the largest hubs hold a few thousand neighbours), scaled to ``num_edges``."""
    gen = torch.Generator().manual_seed(seed)
    ranks = torch.arange(num_nodes, dtype=torch.float64)
    offset = num_nodes / 400.0  # caps the top expected degree at a few thousand
    weight = (ranks + offset) ** (-1.0 / (exponent - 1.0))
    weight = weight[torch.randperm(num_nodes, generator=gen)]  # hubs anywhere in the ids
    draws = int(num_edges * 1.25)
    src = torch.multinomial(weight, draws, replacement=True, generator=gen)
    dst = torch.multinomial(weight, draws, replacement=True, generator=gen)
    return _undirected_from_pairs(src, dst, num_nodes, num_edges, gen)


def uniform_graph(num_nodes: int = PENN94_NODES, num_edges: int = PENN94_EDGES,
                  seed: int = 0) -> Tensor:
    """An Erdos-Renyi-like graph with ``num_edges`` undirected edges (near-uniform degrees)."""
    gen = torch.Generator().manual_seed(seed)
    draws = int(num_edges * 1.05) + 1000
    src = torch.randint(0, num_nodes, (draws,), generator=gen)
    dst = torch.randint(0, num_nodes, (draws,), generator=gen)
    return _undirected_from_pairs(src, dst, num_nodes, num_edges, gen)


def block_model_graph(num_nodes: int = PRODUCTS_NODES, num_edges: int = PRODUCTS_EDGES,
                      block_size: int = 1000, inside: float = 0.9, shuffle: bool = True,
                      seed: int = 0) -> Tensor:
    """A stochastic block model: blocks of ``block_size`` consecutive ids, a share ``inside``
    of the ``num_edges`` undirected edges inside a block, the rest between uniform pairs;
    with ``shuffle`` the ids are then permuted at random (the structure is still there, the
    ids no longer show it)."""
    gen = torch.Generator().manual_seed(seed)
    draws = int(num_edges * 1.1) + 1000
    src = torch.randint(0, num_nodes, (draws,), generator=gen)
    block_start = src - src % block_size
    block_len = torch.clamp(num_nodes - block_start, max=block_size)
    near = block_start + (torch.rand(draws, generator=gen) * block_len).long()
    far = torch.randint(0, num_nodes, (draws,), generator=gen)
    dst = torch.where(torch.rand(draws, generator=gen) < inside, near, far)
    del block_start, block_len, near, far
    edge_index = _undirected_from_pairs(src, dst, num_nodes, num_edges, gen)
    if shuffle:
        edge_index = torch.randperm(num_nodes, generator=gen)[edge_index]
    return edge_index


def degree_skew(edge_index: Tensor, num_nodes: int) -> dict:
    """Degree statistics of a graph: mean, median, max, and the share of edges held by the
    top 1% of nodes."""
    deg = torch.bincount(edge_index[1], minlength=num_nodes).double()
    top = torch.sort(deg, descending=True).values[: max(1, num_nodes // 100)]
    return {"mean": float(deg.mean()), "median": float(deg.median()), "max": int(deg.max()),
            "top1pct_edge_share": float(top.sum() / deg.sum())}
