"""The gather-floor kernel (bench/layer/gather_floor.py) against its PyTorch oracle; on the CPU it
runs in the Triton interpreter (set before Triton defines a kernel)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from gather_floor import CHUNK, gather_neighbour_rows, reference_gathered_sums  # noqa: E402


@pytest.mark.parametrize("m,d,index_dtype", [(0, 8, torch.int32), (1, 3, torch.int64),
                                             (CHUNK * 3 + 17, 64, torch.int32),
                                             (CHUNK * 2, 5, torch.int64)])
def test_gathered_sums_equal_the_reference(m, d, index_dtype):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(m)
    n = 50
    y = torch.randn(n, d, generator=gen).to(device)
    col = torch.randint(0, n, (m,), generator=gen).to(index_dtype).to(device)
    out = gather_neighbour_rows(col, y)
    expected = reference_gathered_sums(col, y)
    assert out.shape == expected.shape
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
