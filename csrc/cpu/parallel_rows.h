// Work-balanced parallel loop over the rows of a CSR matrix.
//
// Real graphs are skewed (facebook100 rows hold thousands of neighbours next to rows of
// one), so splitting rows evenly leaves one thread with most of the edges. The rows are
// cut into chunks of about equal (edges + rows) and the chunks are shared out by
// at::parallel_for. Every row is processed by exactly one thread, in order, so results
// do not depend on the number of threads; per-chunk partial sums are reduced in chunk
// order, so they are deterministic for a given thread count.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dignn {
namespace cpu {

struct RowChunks {
  std::vector<int64_t> bounds;  // chunk c holds rows [bounds[c], bounds[c + 1])
  int64_t size() const { return static_cast<int64_t>(bounds.size()) - 1; }
};

inline RowChunks balanced_row_chunks(const int64_t* rowptr, int64_t n) {
  RowChunks chunks;
  const int64_t threads = at::get_num_threads();
  const int64_t work = rowptr[n] + n;  // one unit per edge and one per row
  // A few chunks per thread smooths out what a single dense row leaves uneven;
  // tiny problems run as one chunk.
  int64_t count = threads <= 1 ? 1 : threads * 8;
  count = std::max<int64_t>(1, std::min<int64_t>(count, work / 2048 + 1));
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

// body(chunk_index, row_begin, row_end)
template <typename Body>
void parallel_for_rows(const RowChunks& chunks, const Body& body) {
  at::parallel_for(0, chunks.size(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      body(c, chunks.bounds[c], chunks.bounds[c + 1]);
    }
  });
}

}  // namespace cpu
}  // namespace dignn
