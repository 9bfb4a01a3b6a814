"""The collectives of a partitioned solve, on torch.distributed (NCCL on GPUs, gloo on CPUs):
the halo exchange (one ``all_to_all_single`` of the needed rows), its reverse (halo rows back
to their owners, summed there), the all-reduce of the solvers' partial sums, and the
all-reduce of the parameter gradients.

Every collective runs under the process group's timeout (``init_process_group(timeout=...)``):
a peer that died or stopped answering makes it raise there, and the error is re-raised as a
:class:`CollectiveError` that names the step, the rank and the way out, instead of a hang.
"""
from __future__ import annotations

from typing import Callable, List

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["CollectiveError", "HaloExchange", "all_reduce_gradients"]


class CollectiveError(RuntimeError):
    """A collective of the distributed solve failed: a peer process died, or did not join the
    collective within the process group's timeout. A ``RuntimeError``; its message names the
    step, the rank and the way out (restart every rank from the last checkpoint), and its
    ``__cause__`` is torch.distributed's own error.

    Example:
        >>> from dignn_kernels.distributed import CollectiveError
        >>> try:
        ...     raise CollectiveError("the halo exchange failed on rank 1 of 2")
        ... except RuntimeError as err:
        ...     print(type(err).__name__, err)
        CollectiveError the halo exchange failed on rank 1 of 2
    """


def _timeout(group) -> str:
    try:
        backend = dist.get_backend(group)
        pg = group if group is not None else dist.distributed_c10d._get_default_group()
        device = torch.device("cpu" if backend == "gloo" else "cuda")
        return str(pg._get_backend(device).options._timeout)
    except Exception:  # private API: the message goes without the value
        return "the process group's timeout"


def run_collective(what: str, group, call: Callable[[], object]):
    """Runs ``call`` (a torch.distributed collective) and turns its failure into a
    :class:`CollectiveError` that says what to do."""
    try:
        return call()
    except CollectiveError:
        raise
    except RuntimeError as err:
        rank = dist.get_rank(group) if dist.is_initialized() else "?"
        world = dist.get_world_size(group) if dist.is_initialized() else "?"
        raise CollectiveError(
            f"dignn_kernels.distributed: the {what} failed on rank {rank} of {world}: a peer "
            f"process exited or did not join it within the process group's timeout "
            f"({_timeout(group)}). Every rank must run the same forward and backward calls; "
            f"stop all ranks and restart them (from the last checkpoint). Cause: {err}"
        ) from err


class HaloExchange:
    """The exchange plan of one rank: ``send_index`` (owned positions of the rows each peer
    reads, concatenated by destination rank), ``send_counts`` and ``recv_counts`` per peer
    (rows). ``active`` is False when no rank of the partition has a halo: then nothing is
    exchanged at all (every rank knows it from the partition, so they agree)."""

    def __init__(self, send_index: Tensor, send_counts: List[int], recv_counts: List[int],
                 group, active: bool):
        self.send_index = send_index
        self.send_counts, self.recv_counts = send_counts, recv_counts
        self.num_halo = sum(recv_counts)
        self.group, self.active = group, active

    def _all_to_all(self, out: Tensor, inp: Tensor, out_counts, in_counts, what: str) -> None:
        run_collective(what, self.group, lambda: dist.all_to_all_single(
            out, inp, out_counts, in_counts, group=self.group))

    def gather(self, owned_rows: Tensor) -> Tensor:
        """The halo rows of a row-distributed tensor (owned rows in, halo rows out)."""
        shape = (self.num_halo,) + tuple(owned_rows.shape[1:])
        halo = owned_rows.new_empty(shape)
        if self.active:
            send = owned_rows.index_select(0, self.send_index).contiguous()
            self._all_to_all(halo, send, self.recv_counts, self.send_counts, "halo exchange")
        return halo

    def scatter_add(self, halo_rows: Tensor, owned_rows: Tensor) -> Tensor:
        """The reverse of :meth:`gather`: adds each halo row into its owner's row (in place
        on ``owned_rows``, which is returned)."""
        if self.active:
            back = halo_rows.new_empty((int(self.send_index.numel()),) +
                                       tuple(halo_rows.shape[1:]))
            self._all_to_all(back, halo_rows.contiguous(), self.send_counts, self.recv_counts,
                             "reverse halo exchange")
            owned_rows.index_add_(0, self.send_index, back)
        return owned_rows


class _Gather(torch.autograd.Function):
    """Halo rows, differentiable: the backward sends the halo rows' gradients back to their
    owners and sums them there."""

    @staticmethod
    def forward(ctx, exchange: HaloExchange, owned_rows: Tensor) -> Tensor:
        ctx.exchange = exchange
        ctx.rows = owned_rows.shape[0]
        return exchange.gather(owned_rows)

    @staticmethod
    def backward(ctx, grad_halo: Tensor):
        shape = (ctx.rows,) + tuple(grad_halo.shape[1:])
        grad = grad_halo.new_zeros(shape)
        return None, ctx.exchange.scatter_add(grad_halo, grad)


def with_halo(exchange: HaloExchange, owned_rows: Tensor) -> Tensor:
    """[owned rows; halo rows], differentiable in ``owned_rows``."""
    return torch.cat([owned_rows, _Gather.apply(exchange, owned_rows)])


def all_reduce_gradients(module: nn.Module, group=None) -> None:
    """Sums the parameters' ``.grad`` over the ranks of ``group`` (default: the whole world),
    in place: after each rank's backward, every rank holds the gradient of the global loss
    (the sum of the ranks' losses). One all-reduce of the flattened gradients, in the fixed
    order of ``module.parameters()``; a parameter without a gradient on this rank counts as
    zero (and gets one), so that the ranks always agree on the buffer.

    Call it after ``loss.backward()`` and before the optimizer step, instead of wrapping the
    model in DDP: DDP's buckets all-reduce asynchronously during the backward, interleaved
    with the layer's own collectives.

    Args:
        module: the ``nn.Module`` whose parameters (those with ``requires_grad``) are summed.
        group: the process group (None: the default group of ``init_process_group``).

    Raises:
        CollectiveError: the all-reduce failed (a peer died or timed out).

    Example:
        >>> import torch
        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> from dignn_kernels.distributed import all_reduce_gradients
        >>> layer = torch.nn.Linear(2, 1)
        >>> layer(torch.ones(1, 2)).sum().backward()
        >>> all_reduce_gradients(layer)  # one rank: the sum is its own gradient
        >>> layer.weight.grad
        tensor([[1., 1.]])
        >>> dist.destroy_process_group()
    """
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    buckets = {}  # one flat buffer per (dtype, device), in parameter order
    for p in params:
        buckets.setdefault((p.grad.dtype, p.grad.device), []).append(p)
    for same in buckets.values():
        flat = torch.cat([p.grad.reshape(-1) for p in same])
        run_collective("gradient all-reduce", group,
                       lambda: dist.all_reduce(flat, group=group))
        offset = 0
        for p in same:
            count = p.grad.numel()
            p.grad.copy_(flat[offset:offset + count].view_as(p.grad))
            offset += count


def all_reduce_sum(group) -> Callable[[Tensor], Tensor]:
    """The solvers' ``reduce``: the sum over ranks of a tensor of partial sums, on its device
    (in place on the fresh partial, which is returned)."""

    def reduce(partial: Tensor) -> Tensor:
        partial = partial.contiguous()
        run_collective("all-reduce of the solver's norms", group,
                       lambda: dist.all_reduce(partial, group=group))
        return partial

    return reduce
