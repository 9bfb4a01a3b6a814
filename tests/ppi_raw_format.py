"""Writes a tiny stand-in for PPI's raw files (the layout of ppi.zip that PyG's ``PPI.process``
reads), so that the PPI loader and training run offline.

Per split (``train``, ``valid``, ``test``) four files under ``<root>/ppi/raw``:

- ``<split>_graph.json``: networkx node-link JSON (keys ``directed``, ``multigraph``,
  ``graph``, ``nodes`` [{"id": i}], ``links`` [{"source": i, "target": j}]) of all the split's
  graphs, nodes numbered 0.. across the split, undirected;
- ``<split>_feats.npy``: float features [nodes, 50];
- ``<split>_labels.npy``: 0/1 labels [nodes, 121];
- ``<split>_graph_id.npy``: each node's graph id, consecutive over the three splits and
  starting at 1 as in the real files (train 1..20, valid 21..22, test 23..24 there).

Each graph is a ring plus a few chords, so every node (the first one included, which PyG's
per-graph renumbering relies on) has an edge. Label ``j`` of a node is on when feature
``j mod 50`` plus the mean of its neighbours' is positive: learnable from the features and the
graph.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

NUM_FEATURES = 50
NUM_LABELS = 121


def write_ppi_raw(root, graphs_per_split: Sequence[int] = (4, 2, 2),
                  nodes_per_graph: Sequence[int] = (6, 10), seed: int = 0) -> Path:
    """Writes ``<root>/ppi/raw/*`` with ``graphs_per_split`` (train, valid, test) graphs of
    between ``nodes_per_graph[0]`` and ``nodes_per_graph[1]`` nodes; returns ``root``."""
    rng = np.random.default_rng(seed)
    raw = Path(root) / "ppi" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    graph_id = 1
    for split, count in zip(("train", "valid", "test"), graphs_per_split):
        links, ids, feats, labels = [], [], [], []
        offset = 0
        for _ in range(count):
            n = int(rng.integers(nodes_per_graph[0], nodes_per_graph[1] + 1))
            pairs = {(i, (i + 1) % n) for i in range(n)}
            for _ in range(n // 2):
                a, b = (int(v) for v in rng.integers(0, n, 2))
                if a != b:
                    pairs.add((a, b))
            x = rng.standard_normal((n, NUM_FEATURES)).astype(np.float32)
            adj = np.zeros((n, n))
            for a, b in pairs:
                adj[a, b] = adj[b, a] = 1.0
            smoothed = x + adj @ x / adj.sum(1, keepdims=True)
            columns = np.arange(NUM_LABELS) % NUM_FEATURES
            labels.append((smoothed[:, columns] > 0).astype(np.int64))
            feats.append(x)
            links += [{"source": a + offset, "target": b + offset} for a, b in sorted(pairs)]
            ids += [graph_id] * n
            offset += n
            graph_id += 1
        graph = {"directed": False, "multigraph": False, "graph": {},
                 "nodes": [{"id": i} for i in range(offset)], "links": links}
        (raw / f"{split}_graph.json").write_text(json.dumps(graph))
        np.save(raw / f"{split}_feats.npy", np.concatenate(feats))
        np.save(raw / f"{split}_labels.npy", np.concatenate(labels))
        np.save(raw / f"{split}_graph_id.npy", np.asarray(ids, dtype=np.int64))
    return Path(root)
