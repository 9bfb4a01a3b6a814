// The heavy-row schedule of the GPU kernels: its vocabulary and every constant, in one place.
//
// The edges of a CSR row are cut into *segments* of at most N edges, in edge order. A row of
// at most N edges is one segment, finished by whoever processes it (almost every row of a real
// graph). A row of more edges is a *heavy row* (the hubs of a power-law graph): cut into
// ceil(deg / N) segments processed side by side, each writing its partial sums to a slot, and a
// second kernel adds the slots of each heavy row in segment order and finishes the row. So a
// row of 10,000 neighbours is spread over the GPU instead of being one long serial loop, and
// every sum has a fixed order: results are bit-for-bit reproducible.
//
// Two backends use it, each with its own segment length N:
// - the CUDA kernels (csrc/cuda/launch.h): kCudaSegmentEdges, and the launch shape below;
// - the Triton kernels (Python, dignn_kernels/backends/schedule.py): kTritonSegmentEdges.
//
// Python reads these values from the compiled extension, with no GPU needed:
// dignn_kernels._C.schedule_constants is a dict {name: value} of kScheduleConstants below,
// named as the Python constants of dignn_kernels/backends/schedule.py (CUDA_SEGMENT_EDGES,
// TRITON_SEGMENT_EDGES, ...); tests/test_schedule_constants.py checks that the two agree.
#pragma once

#include <cstdint>

namespace dignn {

// Edges per segment of the CUDA kernels.
constexpr int64_t kCudaSegmentEdges = 128;
// Edges per segment of the Triton kernels.
constexpr int64_t kTritonSegmentEdges = 64;

// The CUDA launch shape (csrc/cuda/launch.h):
// Threads per block of the row and gradient kernels: small blocks, so that a block holding one
// long segment keeps few other lanes idle until it retires (Hopper runs up to 32 blocks per SM).
constexpr int kCudaBlockThreads = 64;
// A segment is processed by a group of G consecutive lanes of a warp, G a power of two from
// kCudaMinGroupLanes to a whole warp: the smallest that covers the channels with
// kCudaVecsPerLane channel vectors per lane.
constexpr int kCudaMinGroupLanes = 4;
constexpr int kCudaWarpLanes = 32;
constexpr int kCudaVecsPerLane = 2;
// Neighbour rows a group gathers at a time: in the row pass, and in the gradient pass (where
// each also holds its p_j and q_j vectors).
constexpr int kCudaRowUnroll = 4;
constexpr int kCudaGradUnroll = 2;
// Threads per block of the per-row and reduction kernels (schedule, coefficients, norms).
constexpr int kCudaReduceThreads = 256;

struct ScheduleConstant {
  const char* name;  // as in dignn_kernels/backends/schedule.py
  int64_t value;
};

inline constexpr ScheduleConstant kScheduleConstants[] = {
    {"CUDA_SEGMENT_EDGES", kCudaSegmentEdges},
    {"TRITON_SEGMENT_EDGES", kTritonSegmentEdges},
    {"CUDA_BLOCK_THREADS", kCudaBlockThreads},
    {"CUDA_MIN_GROUP_LANES", kCudaMinGroupLanes},
    {"CUDA_WARP_LANES", kCudaWarpLanes},
    {"CUDA_VECS_PER_LANE", kCudaVecsPerLane},
    {"CUDA_ROW_UNROLL", kCudaRowUnroll},
    {"CUDA_GRAD_UNROLL", kCudaGradUnroll},
    {"CUDA_REDUCE_THREADS", kCudaReduceThreads},
};

}  // namespace dignn
