// The few SIMT primitives the dignn CUDA kernels use, in two builds of one source:
//
// - compiled by nvcc (__CUDACC__): the CUDA intrinsics (threadIdx, __shfl_sync, __ldg, ...);
//   (a host compiler that includes this for the CUDA build's host code gets the types only);
// - compiled by a host compiler with DIGNN_SIMT_EMULATION defined: a slow but faithful host
//   emulator in which every CUDA thread of a block is a fiber (run round-robin until it waits),
//   warp shuffles exchange values through per-thread slots guarded by per-group barriers, and
//   __syncthreads is a block barrier. Blocks run one after another. It exists so that the
//   kernels' logic (indexing, sub-warp groups, heavy rows and their segments, fixed-order
//   reductions, convergence flags) is tested on machines without a GPU
//   (tests/test_cuda_emulated.py); it is never part of the package.
//
// Kernels only use: thread_idx(), block_idx(), sync_block(), shfl/shfl_xor within a group of
// `width` consecutive lanes whose mask is exactly that group, ldg, fused multiply-add, and
// DIGNN_SHARED arrays. Every lane of a group executes the same shuffles (group-uniform control
// flow), and every thread of a block reaches every sync_block().
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#if defined(__CUDACC__) && !defined(DIGNN_SIMT_EMULATION)

#include <cuda_runtime.h>

#define DIGNN_SIMT_NS cuda
#define DIGNN_KERNEL(THREADS) __global__ void __launch_bounds__(THREADS)
#define DIGNN_DEV __device__ __forceinline__
#define DIGNN_HOST_DEV __host__ __device__ __forceinline__
#define DIGNN_SHARED __shared__
#define DIGNN_UNROLL _Pragma("unroll")

namespace dignn {
namespace simt {

using Stream = cudaStream_t;

DIGNN_DEV int thread_idx() { return static_cast<int>(threadIdx.x); }
DIGNN_DEV int64_t block_idx() { return static_cast<int64_t>(blockIdx.x); }
DIGNN_DEV void sync_block() { __syncthreads(); }

template <typename X>
DIGNN_DEV X shfl(unsigned mask, X v, int src, int width) {
  return __shfl_sync(mask, v, src, width);
}
template <typename X>
DIGNN_DEV X shfl_xor(unsigned mask, X v, int lane_mask, int width) {
  return __shfl_xor_sync(mask, v, lane_mask, width);
}
// Read-only (for the whole kernel) global data: the non-coherent load path.
template <typename X>
DIGNN_DEV X ldg(const X* p) {
  return __ldg(p);
}
DIGNN_DEV float madd(float a, float b, float c) { return fmaf(a, b, c); }
DIGNN_DEV double madd(double a, double b, double c) { return fma(a, b, c); }

// Launches kernel<<<grid, threads, 0, stream>>>(args...); returns the launch status.
template <typename... Params, typename... Args>
inline int launch(void (*kernel)(Params...), int64_t grid, int threads, Stream stream,
                  Args&&... args) {
  if (grid <= 0) return 0;
  kernel<<<static_cast<unsigned>(grid), threads, 0, stream>>>(std::forward<Args>(args)...);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace simt
}  // namespace dignn

#elif defined(DIGNN_SIMT_EMULATION)

#include <ucontext.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#define DIGNN_SIMT_NS emulated
#define DIGNN_KERNEL(THREADS) void
#define DIGNN_DEV inline
#define DIGNN_HOST_DEV inline
// Blocks run one at a time, so a function-local static is shared by exactly the threads of
// the running block, like __shared__ memory.
#define DIGNN_SHARED static
#define DIGNN_UNROLL

namespace dignn {
namespace simt {

using Stream = int;

// The threads of a block are fibers (ucontext) of the calling OS thread, run round-robin by a
// scheduler; a thread runs until it waits at a barrier. Deterministic, and a round in which
// no thread can advance is reported as a deadlock (a shuffle or __syncthreads that not every
// thread of its group or block reaches).
struct FiberBarrier {
  int count = 0;
  int arrived = 0;
  uint64_t generation = 0;
};

struct Emulator {
  ucontext_t scheduler{};
  std::vector<ucontext_t> fibers;
  std::vector<char> done;
  int current = 0;
  int64_t block = 0;
  uint64_t progress = 0;  // arrivals and completions: a round without any is a deadlock
  FiberBarrier block_barrier;
  std::vector<FiberBarrier> group_barriers;  // by first thread of the group
  std::vector<uint64_t> slots;              // shuffle exchange, one per thread
  void (*body)(void*) = nullptr;
  void* body_arg = nullptr;
  std::string error;

  static constexpr size_t kStackBytes = 64 * 1024;

  void yield() { swapcontext(&fibers[current], &scheduler); }

  void wait(FiberBarrier& b) {
    const uint64_t gen = b.generation;
    ++progress;
    if (++b.arrived == b.count) {
      b.arrived = 0;
      ++b.generation;
      return;
    }
    while (b.generation == gen) yield();
  }
};

inline Emulator*& emulator() {
  static thread_local Emulator* e = nullptr;
  return e;
}

inline int thread_idx() { return emulator()->current; }
inline int64_t block_idx() { return emulator()->block; }
inline void sync_block() {
  Emulator& e = *emulator();
  e.wait(e.block_barrier);
}

inline int popcount32(unsigned v) {
  int c = 0;
  for (; v; v &= v - 1) ++c;
  return c;
}
inline int lowest_bit(unsigned v) {
  int b = 0;
  while (!(v >> b & 1u)) ++b;
  return b;
}

// Value of `v` held by warp lane `src_lane` among the lanes of `mask` (which must all call).
template <typename X>
X exchange(unsigned mask, X v, int src_lane) {
  static_assert(sizeof(X) <= sizeof(uint64_t), "shuffle of a value wider than 8 bytes");
  Emulator& e = *emulator();
  const int thread = e.current;
  const int lane = thread & 31;
  const int warp_base = thread & ~31;
  if (!(mask >> lane & 1u) || !(mask >> src_lane & 1u)) {
    throw std::logic_error("emulated shuffle: lane outside the mask");
  }
  const int first = warp_base + lowest_bit(mask);
  if (first + popcount32(mask) > static_cast<int>(e.slots.size())) {
    throw std::logic_error("emulated shuffle: mask beyond the block");
  }
  FiberBarrier& bar = e.group_barriers[first];
  if (bar.count == 0) bar.count = popcount32(mask);
  if (bar.count != popcount32(mask)) throw std::logic_error("emulated shuffle: group changed");
  uint64_t slot = 0;
  std::memcpy(&slot, &v, sizeof(X));
  e.slots[thread] = slot;
  e.wait(bar);  // every lane of the group has written
  X out;
  const uint64_t got = e.slots[warp_base + src_lane];
  std::memcpy(&out, &got, sizeof(X));
  e.wait(bar);  // every lane has read before the slots are reused
  return out;
}

template <typename X>
X shfl(unsigned mask, X v, int src, int width) {
  const int lane = emulator()->current & 31;
  return exchange(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <typename X>
X shfl_xor(unsigned mask, X v, int lane_mask, int width) {
  const int lane = emulator()->current & 31;
  const int src = lane ^ lane_mask;
  if ((src & ~(width - 1)) != (lane & ~(width - 1))) {
    throw std::logic_error("emulated shuffle: xor leaves the group");
  }
  return exchange(mask, v, src);
}
template <typename X>
X ldg(const X* p) {
  return *p;
}
inline float madd(float a, float b, float c) { return std::fma(a, b, c); }
inline double madd(double a, double b, double c) { return std::fma(a, b, c); }

inline void fiber_entry() {
  Emulator& e = *emulator();
  try {
    e.body(e.body_arg);
  } catch (const std::exception& err) {
    if (e.error.empty()) e.error = err.what();
  }
  e.done[e.current] = 1;
  ++e.progress;
  // returning resumes uc_link, the scheduler
}

// Runs `body` for every thread of every block of the grid; throws on a kernel error.
inline void emulate_grid(int64_t grid, int threads, void (*body)(void*), void* arg) {
  Emulator e;
  Emulator* outer = emulator();
  emulator() = &e;
  e.fibers.resize(threads);
  e.done.assign(threads, 0);
  e.slots.assign(threads, 0);
  e.body = body;
  e.body_arg = arg;
  static thread_local std::vector<std::unique_ptr<char[]>> stack_pool;  // reused by launches
  while (static_cast<int>(stack_pool.size()) < threads) {
    stack_pool.emplace_back(new char[Emulator::kStackBytes]);
  }
  for (int64_t b = 0; b < grid && e.error.empty(); ++b) {
    e.block = b;
    e.block_barrier = FiberBarrier{threads, 0, 0};
    e.group_barriers.assign(threads, FiberBarrier{});
    std::fill(e.done.begin(), e.done.end(), 0);
    for (int t = 0; t < threads; ++t) {
      getcontext(&e.fibers[t]);
      e.fibers[t].uc_stack.ss_sp = stack_pool[t].get();
      e.fibers[t].uc_stack.ss_size = Emulator::kStackBytes;
      e.fibers[t].uc_link = &e.scheduler;
      makecontext(&e.fibers[t], fiber_entry, 0);
    }
    int remaining = threads;
    while (remaining > 0 && e.error.empty()) {
      const uint64_t before = e.progress;
      for (int t = 0; t < threads && e.error.empty(); ++t) {
        if (e.done[t]) continue;
        e.current = t;
        swapcontext(&e.scheduler, &e.fibers[t]);
        if (e.done[t]) --remaining;
      }
      if (remaining > 0 && e.progress == before && e.error.empty()) {
        e.error = "deadlock: threads wait at a barrier or shuffle that others never reach";
      }
    }
  }
  emulator() = outer;
  if (!e.error.empty()) throw std::runtime_error("emulated kernel: " + e.error);
}

template <typename... Params, typename... Args>
int launch(void (*kernel)(Params...), int64_t grid, int threads, Stream, Args&&... args) {
  if (grid <= 0) return 0;
  auto call = [&]() { kernel(args...); };
  emulate_grid(grid, threads, [](void* f) { (*static_cast<decltype(call)*>(f))(); }, &call);
  return 0;
}

}  // namespace simt
}  // namespace dignn

#else  // the host code of the CUDA build (ops_cuda.cpp): types only, no kernels

#include <cuda_runtime_api.h>

#define DIGNN_SIMT_NS cuda
#define DIGNN_HOST_DEV inline

namespace dignn {
namespace simt {
using Stream = cudaStream_t;
}  // namespace simt
}  // namespace dignn

#endif
