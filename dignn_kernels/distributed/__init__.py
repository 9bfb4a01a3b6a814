"""Full-graph implicit diffusion partitioned over ``torch.distributed`` processes.

The nodes are split over the ranks (:func:`partition`: contiguous blocks, or METIS through the
optional ``pymetis``); each rank holds its rows of the graph and of every row-distributed
tensor, and reads the rows of other ranks that its rows need (its halo) by an
``all_to_all`` per sweep, as CAGNET and BNS-GCN do for full-batch GNNs::

    import torch.distributed as dist
    from dignn_kernels import FusedImplicitDiffusion
    from dignn_kernels.distributed import partition, DistributedGraph, all_reduce_gradients

    part = partition(edge_index, num_nodes, parts=dist.get_world_size(), method="metis")
    graph = DistributedGraph(part)                 # this rank's piece
    z = layer(x[graph.owned], graph)               # the owned rows of Z
    loss.backward(); all_reduce_gradients(model)   # Theta gradients summed over the ranks

- :mod:`.partition`: :func:`partition`, :class:`GraphPartition` (save / load, stats);
- :mod:`.graph`: :class:`DistributedGraph`, one rank's piece on its device;
- :mod:`.exchange`: the collectives (halo exchange, its reverse, all-reduces), with errors
  that say what happened when a peer died or a collective timed out;
- :mod:`.system`, :mod:`.solve`: the solvers of :mod:`dignn_kernels.solvers` on a rank's rows.
"""
from .exchange import CollectiveError, all_reduce_gradients
from .graph import DistributedGraph
from .partition import METHODS, GraphPartition, partition

__all__ = ["partition", "GraphPartition", "DistributedGraph", "all_reduce_gradients",
           "CollectiveError", "METHODS"]
