"""The heavy-row schedule's constants (csrc/dignn/schedule.h) as the compiled extension exposes
them, and their agreement with the Python backends' (dignn_kernels/backends/schedule.py).

Vocabulary: a row with more edges than the segment length is a *heavy row*, cut into
*segments* of at most that many edges whose partial sums are added in a fixed order; the CUDA
and the Triton kernels each have their own segment length.
"""
import pytest

from dignn_kernels import _C

# Every name of csrc/dignn/schedule.h's kScheduleConstants.
NAMES = {"CUDA_SEGMENT_EDGES", "TRITON_SEGMENT_EDGES", "CUDA_BLOCK_THREADS",
         "CUDA_MIN_GROUP_LANES", "CUDA_WARP_LANES", "CUDA_VECS_PER_LANE", "CUDA_ROW_UNROLL",
         "CUDA_GRAD_UNROLL", "CUDA_REDUCE_THREADS"}


def test_the_extension_exposes_the_constants_without_a_gpu():
    constants = _C.schedule_constants
    assert set(constants) == NAMES
    assert all(type(v) is int and v > 0 for v in constants.values()), constants


def test_cpp_and_python_agree():
    """Each constant that dignn_kernels.backends.schedule defines has the C++ value; both
    segment lengths must be there."""
    schedule = pytest.importorskip("dignn_kernels.backends.schedule")
    constants = _C.schedule_constants
    assert schedule.CUDA_SEGMENT_EDGES == constants["CUDA_SEGMENT_EDGES"]
    assert schedule.TRITON_SEGMENT_EDGES == constants["TRITON_SEGMENT_EDGES"]
    for name, value in constants.items():
        if hasattr(schedule, name):
            assert getattr(schedule, name) == value, name
