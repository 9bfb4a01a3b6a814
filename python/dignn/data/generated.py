"""Generated graphs that need no files: the contextual stochastic block model (the default
dataset) and a graph of Penn94's shape."""
from __future__ import annotations

import math
from typing import Optional

import torch

from .core import NodeDataset, edge_homophily, random_splits

__all__ = ["csbm", "penn94_synthetic"]



def csbm(num_nodes: int = 1500, num_classes: int = 4, num_features: int = 32,
         avg_degree: float = 10.0, homophily: float = 0.75, signal: float = 0.6,
         num_splits: int = 10, seed: int = 0) -> NodeDataset:
    """A contextual stochastic block model: balanced classes, Gaussian features around class
    means and ``avg_degree * num_nodes / 2`` undirected edges of which a share ``homophily``
    (in expectation) join nodes of the same class, the rest nodes of different classes.

    ``homophily`` is the knob: 1/num_classes is an uninformative graph, 1 a graph of pure
    clusters, 0 a purely heterophilous one. ``signal`` is the distance of the class means
    relative to the per-coordinate noise (features alone then classify only part of the
    nodes). Splits are seeded 60/20/20 (split k uses seed k)."""
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must be in [0, 1], got {homophily}")
    if num_nodes < 4 * num_classes:
        raise ValueError(f"num_nodes must be at least 4 * num_classes = {4 * num_classes}, "
                         f"got {num_nodes}")
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(num_nodes) % num_classes
    y = y[torch.randperm(num_nodes, generator=gen)]
    members = [torch.nonzero(y == c).flatten() for c in range(num_classes)]
    sizes = torch.tensor([m.numel() for m in members])
    num_edges = int(round(avg_degree * num_nodes / 2))
    draws = int(num_edges * 1.2) + 16
    src = torch.randint(0, num_nodes, (draws,), generator=gen)
    same = torch.rand(draws, generator=gen) < homophily
    shift = torch.randint(1, num_classes, (draws,), generator=gen)
    target_class = torch.where(same, y[src], (y[src] + shift) % num_classes)
    pick = (torch.rand(draws, generator=gen) * sizes[target_class]).long()
    table = torch.full((num_classes, int(sizes.max())), -1, dtype=torch.long)
    for c, m in enumerate(members):
        table[c, : m.numel()] = m
    dst = table[target_class, pick]
    keep = src != dst
    lo = torch.minimum(src[keep], dst[keep])
    hi = torch.maximum(src[keep], dst[keep])
    key = torch.unique(lo * num_nodes + hi)
    key = key[torch.randperm(key.numel(), generator=gen)[:num_edges]]
    lo, hi = key // num_nodes, key % num_nodes
    edge_index = torch.stack([torch.cat([lo, hi]), torch.cat([hi, lo])])
    means = torch.randn(num_classes, num_features, generator=gen)
    means = means / means.norm(dim=1, keepdim=True) * signal * math.sqrt(num_features) / 2
    x = means[y] + torch.randn(num_nodes, num_features, generator=gen)
    splits = random_splits(y, num_splits, train=0.6, val=0.2)
    desc = (f"CSBM: {num_nodes} nodes, {edge_index.size(1) // 2} undirected edges, "
            f"{num_classes} classes, edge homophily {edge_homophily(edge_index, y):.2f}")
    return NodeDataset("csbm", x, y, edge_index, num_classes, splits, desc)


def penn94_synthetic(num_nodes: Optional[int] = None, num_edges: Optional[int] = None,
                     num_features: int = 64, signal: float = 0.35, num_splits: int = 10,
                     seed: int = 0) -> NodeDataset:
    """The Penn94-shaped graph of :func:`dignn_kernels.synthetic.penn94_like_graph` (41,554
    nodes, 1,362,229 undirected edges, heavy-tailed degrees) with synthetic labels and
    features for the two-class task of facebook100.

    Labels: every node gets a hidden random class c_j in {0, 1}; node i's label is the
    majority of c over its neighbours (ties and isolated nodes: c_i). So, as for facebook100's
    gender labels, the edge homophily is about 0.5 and the label is written in *which* nodes a
    node links to, the signal LINKX's A-branch reads. 10% of the nodes are unlabeled (-1), as
    in facebook100. Features: Gaussian around +-``signal`` class means (weakly informative).
    Splits: seeded 50/25/25 of the labeled nodes. ``num_nodes``/``num_edges`` give a smaller
    graph of the same shape."""
    from dignn_kernels.synthetic import PENN94_EDGES, PENN94_NODES, penn94_like_graph
    n = num_nodes or PENN94_NODES
    m = num_edges or (PENN94_EDGES if num_nodes is None else int(n * 16))
    edge_index = penn94_like_graph(num_nodes=n, num_edges=m, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    hidden = torch.randint(0, 2, (n,), generator=gen)
    vote = torch.zeros(n).index_add_(0, edge_index[1], 2.0 * hidden[edge_index[0]].float() - 1)
    y = torch.where(vote > 0, 1, torch.where(vote < 0, 0, hidden)).long()
    y[torch.rand(n, generator=gen) < 0.1] = -1
    direction = torch.randn(num_features, generator=gen)
    direction = direction / direction.norm() * signal * math.sqrt(num_features)
    sign = (2.0 * y.clamp_min(0).float() - 1.0).unsqueeze(1)
    x = sign * direction / 2 + torch.randn(n, num_features, generator=gen)
    splits = random_splits(y, num_splits)
    desc = (f"Penn94-shaped synthetic: {n} nodes, {edge_index.size(1) // 2} undirected "
            f"edges, 2 classes, edge homophily {edge_homophily(edge_index, y):.2f}")
    return NodeDataset("penn94-synthetic", x, y, edge_index, 2, splits, desc)


