"""The gather floor of a CSR sweep: a Triton kernel that only gathers the neighbour rows.

A row pass (:mod:`dignn_kernels.backends.interface`) reads, for every CSR entry (i, j), the
neighbour row y_j: m gathers of d values. :func:`gather_neighbour_rows` does exactly those
gathers and nothing else: the entries are split into equal chunks of ``CHUNK`` (no row
imbalance), each program sums the rows its chunk gathers and writes one row of partial sums
(m / CHUNK rows, so the writes are negligible). Its time is the floor the cached sweep is
held to (issue: within 1.3x of it), measured on the same graph and the same y by
bench/layer/test_gpu_speed.py::test_gather_floor. :func:`reference_gathered_sums` is the same sum
in PyTorch, its test oracle (bench/layer/test_gather_floor.py, which also runs in the Triton
interpreter on the CPU).
"""
import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["CHUNK", "gather_neighbour_rows", "reference_gathered_sums"]

CHUNK = 128  # CSR entries per program


@triton.jit
def _gather_kernel(col, y, out, num_entries, D, CHUNK: tl.constexpr, BLOCK_E: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_D)
    cmask = cols < D
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for offset in range(0, CHUNK, BLOCK_E):
        e = pid.to(tl.int64) * CHUNK + offset + tl.arange(0, BLOCK_E)
        emask = e < num_entries
        j = tl.load(col + e, mask=emask, other=0).to(tl.int64)
        rows = tl.load(y + j[:, None] * D + cols[None, :],
                       mask=emask[:, None] & cmask[None, :], other=0.0)
        acc += tl.sum(rows.to(tl.float32), axis=0)
    tl.store(out + pid.to(tl.int64) * D + cols, acc, mask=cmask)


def gather_neighbour_rows(col: Tensor, y: Tensor, out: Tensor = None) -> Tensor:
    """Float32 [ceil(m / CHUNK), d]: row c is the sum of the rows y[col[k]] for the entries k
    of chunk c (``col``: the CSR's column ids, int32 or int64; ``y``: [n, d], contiguous)."""
    m, d = col.numel(), y.size(1)
    chunks = max(1, triton.cdiv(m, CHUNK))
    if out is None:
        out = torch.empty(chunks, d, dtype=torch.float32, device=y.device)
    block_d = triton.next_power_of_2(d)
    _gather_kernel[(chunks,)](col, y, out, m, d, CHUNK=CHUNK, BLOCK_E=32, BLOCK_D=block_d)
    return out


def reference_gathered_sums(col: Tensor, y: Tensor) -> Tensor:
    """The same partial sums in PyTorch (float64)."""
    m, d = col.numel(), y.size(1)
    chunks = max(1, -(-m // CHUNK))
    gathered = torch.zeros(chunks * CHUNK, d, dtype=torch.float64, device=y.device)
    gathered[:m] = y.double()[col.long()]
    return gathered.view(chunks, CHUNK, d).sum(dim=1)
