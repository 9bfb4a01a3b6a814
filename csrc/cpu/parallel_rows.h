// Work-balanced parallel loop over the rows of a CSR matrix.
//
// Real graphs are skewed (facebook100 rows hold thousands of neighbours next to rows of
// one), so splitting rows evenly leaves one thread with most of the edges. The rows are
// cut into chunks of about equal work (edges + rows) and the chunks are shared out by
// at::parallel_for. Every row is processed by exactly one thread, in order, and the chunks
// depend only on the graph, never on the thread count: per-chunk partial sums (the step
// norms) are reduced in chunk order, so every result is bitwise the same at any number of
// threads. (While the chunk count followed at::get_num_threads(), the norms -- residual
// stats and the convergence test -- differed in their last bits between 1 and 2 threads,
// even in builds that ran every chunk on one thread; tests/test_ops.py checks it now.)
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dignn {
namespace cpu {

// A pass over less work than this (edges + rows) runs as one chunk on the calling thread,
// without entering at::parallel_for. Measured with bench/layer/cpu_grain.py: random symmetric
// graphs of 1.2k to 2.5M work, h = 64, float32, csr_fma / neural_edge_weights /
// neural_weight_grad at 1 and 2 threads, 2-core AMD EPYC, extension built with -fopenmp,
// 2:1 = median time ratio of adjacent 2- and 1-thread batches:
//   - other core idle: 2 threads win from ~3k work on (2:1 0.55-0.8 at 3k-12k, ~0.5 from
//     50k on);
//   - busy loop on the other core: 2 threads lose (2:1 1.3-1.7) up to ~50k work in every
//     pass, as the thread sharing a core with the other job holds up the barrier; from
//     ~60k the heavier passes break even (0.75-1.0), csr_fma up to ~250k loses 1.3-2.0.
// In absolute time the busy loss matches or exceeds the idle gain up to ~30k work (30k:
// csr_fma idle 326 -> 179 us but busy 321 -> 499 us; neural_weight_grad 3.9 -> 2.1 ms vs
// 4.5 -> 7.7 ms) and is clearly smaller from 50k on (neural_weight_grad 3.3 -> 1.7 ms vs
// 3.1 -> 3.5 ms; csr_fma 193 -> 105 us vs 182 -> 240 us); the threshold lies between. The
// default `dignn train` graph (CSBM, 9k work) runs single-threaded in the kernels.
// setup.py and CMakeLists.txt compile with -fopenmp: without it at::parallel_for runs every
// chunk on the calling thread whatever the threshold (as every build before did).
constexpr int64_t kSerialWork = 32768;
// Above it: chunks of about this much work, at most kMaxChunks of them (enough to balance
// any common thread count: the slowest thread gets at most one chunk more than its share).
constexpr int64_t kChunkWork = 1024;
constexpr int64_t kMaxChunks = 256;

struct RowChunks {
  std::vector<int64_t> bounds;  // chunk c holds rows [bounds[c], bounds[c + 1])
  int64_t size() const { return static_cast<int64_t>(bounds.size()) - 1; }
};

// The chunks of a graph; a function of rowptr alone (see above).
inline RowChunks balanced_row_chunks(const int64_t* rowptr, int64_t n) {
  RowChunks chunks;
  const int64_t work = rowptr[n] + n;  // one unit per edge and one per row
  const int64_t count =
      work < kSerialWork ? 1 : std::min<int64_t>(kMaxChunks, work / kChunkWork);
  chunks.bounds.resize(count + 1);
  chunks.bounds[0] = 0;
  for (int64_t c = 1; c < count; ++c) {
    const int64_t target = work * c / count;
    // smallest row r with rowptr[r] + r >= target
    int64_t lo = chunks.bounds[c - 1], hi = n;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (rowptr[mid] + mid < target) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    chunks.bounds[c] = lo;
  }
  chunks.bounds[count] = n;
  return chunks;
}

// The chunks of n rows of equal work (`row_work` units each, as above: one per gathered row),
// cut at multiples of the rows per chunk; a function of n and row_work alone.
inline RowChunks uniform_row_chunks(int64_t n, int64_t row_work) {
  RowChunks chunks;
  const int64_t work = n * std::max<int64_t>(row_work, 1);
  const int64_t count = work < kSerialWork || n < 2
                            ? 1
                            : std::min<int64_t>({kMaxChunks, work / kChunkWork, n});
  const int64_t rows = (n + count - 1) / count;
  for (int64_t r = 0; r < n; r += rows) chunks.bounds.push_back(r);
  chunks.bounds.push_back(n);
  if (n == 0) chunks.bounds = {0, 0};
  return chunks;
}

// body(chunk_index, row_begin, row_end)
// One chunk: the body runs right here, no OpenMP region is entered.
template <typename Body>
void parallel_for_rows(const RowChunks& chunks, const Body& body) {
  if (chunks.size() == 1) {
    body(0, chunks.bounds[0], chunks.bounds[1]);
    return;
  }
  at::parallel_for(0, chunks.size(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      body(c, chunks.bounds[c], chunks.bounds[c + 1]);
    }
  });
}

}  // namespace cpu
}  // namespace dignn
