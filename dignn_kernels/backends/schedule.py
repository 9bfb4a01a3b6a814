"""The heavy-row schedule's constants, for Python (the Triton kernels); the same values are
defined once for C++ in csrc/dignn/schedule.h, and tests/test_schedule_constants.py holds the
two to each other.

Vocabulary, shared by the CUDA and Triton kernels: a row's edges are cut into *segments* of at
most ``*_SEGMENT_EDGES`` edges; a *heavy row* has more than one segment, whose partial sums go
to scratch slots and are added in slot order by a second kernel (results are the same bit for
bit from run to run). The lengths differ per backend because their programs differ: a CUDA
warp walks a segment of 128 edges with its lanes over the channels; a Triton program tiles
many segments x channels and loops at most the segment length (bench/layer/test_triton_speed.py).
"""

__all__ = ["CUDA_SEGMENT_EDGES", "TRITON_SEGMENT_EDGES"]

CUDA_SEGMENT_EDGES = 128
TRITON_SEGMENT_EDGES = 64
