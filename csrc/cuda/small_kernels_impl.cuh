// The small kernels around the row passes: the work schedule, per-row coefficients, row sums,
// and the fixed-order reductions that turn a step's block sums into the solve's stats and its
// convergence flag on the device (no host sync).
#pragma once

#include "cuda/device_common.cuh"

namespace dignn {
namespace DIGNN_SIMT_NS {

// counts[c][i], [3][n]: c = 0 the segments of row i, 1 the same when the row is heavy (more
// than one segment) else 0, 2 one when the row is heavy else 0.
DIGNN_KERNEL(kCudaReduceThreads) schedule_counts_kernel(const int64_t* rowptr, int64_t n,
                                                        int64_t* counts) {
  const int64_t i = simt::block_idx() * kCudaReduceThreads + simt::thread_idx();
  if (i >= n) return;
  const int64_t deg = rowptr[i + 1] - rowptr[i];
  const int64_t nseg = deg > kSegmentEdges ? ceil_div(deg, kSegmentEdges) : 1;
  const bool heavy = nseg > 1;
  counts[i] = nseg;
  counts[n + i] = heavy ? nseg : 0;
  counts[2 * n + i] = heavy ? 1 : 0;
}

// From the inclusive sums of the counts: segment_row for every segment, heavy_row for every
// heavy row.
DIGNN_KERNEL(kCudaReduceThreads) schedule_fill_kernel(const int64_t* incl, int64_t n,
                                                      int32_t* segment_row, int32_t* heavy_row) {
  const int64_t i = simt::block_idx() * kCudaReduceThreads + simt::thread_idx();
  if (i >= n) return;
  const int64_t first = i > 0 ? incl[i - 1] : 0;
  const int64_t last = incl[i];
  for (int64_t sg = first; sg < last; ++sg) segment_row[sg] = static_cast<int32_t>(i);
  if (last - first > 1) heavy_row[incl[2 * n + i] - 1] = static_cast<int32_t>(i);
}

template <typename T>
DIGNN_KERNEL(kCudaReduceThreads) row_coefficients_kernel(const T* chi, const T* kappa,
                                                         T inv_mu, int64_t n, T* cy, T* rs) {
  const int64_t i = simt::block_idx() * kCudaReduceThreads + simt::thread_idx();
  if (i >= n) return;
  const RowCoefficients<T> rc = row_coefficients(chi[i], kappa[i], inv_mu);
  cy[i] = rc.cy;
  rs[i] = rc.rs;
}

// out_i = sum_k values_k over row i; one warp per row, lane-strided then a fixed butterfly.
template <typename T>
DIGNN_KERNEL(kCudaBlockThreads) row_sums_kernel(const int64_t* rowptr, const T* values,
                                                int64_t n, T* out) {
  const Group<32> grp;
  const int64_t i =
      simt::block_idx() * (kCudaBlockThreads / kCudaWarpLanes) + simt::thread_idx() / 32;
  if (i >= n) return;  // whole warps only
  T s = T(0);
  for (int64_t k = rowptr[i] + grp.lane; k < rowptr[i + 1]; k += 32) s += values[k];
  s = grp.sum(s);
  if (grp.lane == 0) out[i] = s;
}

// Fixed-order sum over a block of kBlock threads (a tree in shared memory); the result is in
// thread 0. Every thread of the block must call it.
template <int kBlock>
DIGNN_DEV void block_sum2(double& a, double& b) {
  DIGNN_SHARED double sa[kBlock];
  DIGNN_SHARED double sb[kBlock];
  const int t = simt::thread_idx();
  sa[t] = a;
  sb[t] = b;
  simt::sync_block();
  for (int s = kBlock / 2; s > 0; s >>= 1) {
    if (t < s) {
      sa[t] += sa[t + s];
      sb[t] += sb[t + s];
    }
    simt::sync_block();
  }
  a = sa[0];
  b = sb[0];
  simt::sync_block();  // the arrays may be reused by the caller's next call
}

constexpr int64_t kSumSquaresPerThread = 8;
constexpr int64_t kMaxSumSquaresBlocks = 1024;

DIGNN_HOST_DEV int64_t sum_squares_blocks_impl(int64_t count) {
  const int64_t per_block = kCudaReduceThreads * kSumSquaresPerThread;
  int64_t blocks = ceil_div(count, per_block);
  if (blocks > kMaxSumSquaresBlocks) blocks = kMaxSumSquaresBlocks;
  return blocks < 1 ? 1 : blocks;
}

// ||x||^2 (x stored as S, widened to T; squares in T, sums in double) as block sums, written
// twice: iteration 1 of a solve from zero has out = x and out - previous = x.
template <typename T, typename S>
DIGNN_KERNEL(kCudaReduceThreads) sum_squares_kernel(const S* x, int64_t count,
                                                    double* block_norms) {
  const int64_t stride =
      static_cast<int64_t>(kCudaReduceThreads) * sum_squares_blocks_impl(count);
  double s = 0.0;
  for (int64_t k = simt::block_idx() * kCudaReduceThreads + simt::thread_idx(); k < count;
       k += stride) {
    const T v = static_cast<T>(x[k]);
    s += static_cast<double>(v * v);
  }
  double s2 = s;
  block_sum2<kCudaReduceThreads>(s, s2);
  if (simt::thread_idx() == 0) {
    block_norms[2 * simt::block_idx()] = s;
    block_norms[2 * simt::block_idx() + 1] = s;
  }
}

constexpr int kFinalizeThreads = 1024;

// Adds pairs[2k], pairs[2k + 1] for k = t, t + kFinalizeThreads, ... in that order, issuing
// four independent loads per thread before using them.
DIGNN_DEV void strided_pair_sum(const double* pairs, int64_t count, int t, double& a,
                                double& b) {
  constexpr int64_t kStep = kFinalizeThreads;
  int64_t k = t;
  for (; k + 3 * kStep < count; k += 4 * kStep) {
    double v[8];
    DIGNN_UNROLL
    for (int r = 0; r < 4; ++r) {
      v[2 * r] = pairs[2 * (k + r * kStep)];
      v[2 * r + 1] = pairs[2 * (k + r * kStep) + 1];
    }
    DIGNN_UNROLL
    for (int r = 0; r < 4; ++r) {
      a += v[2 * r];
      b += v[2 * r + 1];
    }
  }
  for (; k < count; k += kStep) {
    a += pairs[2 * k];
    b += pairs[2 * k + 1];
  }
}

// One block: sums the block sums of a step in a fixed order, then (unless the solve already
// stopped) writes stats = [iteration, ||diff||, ||diff|| / ||out||] and the flag, exactly as
// the CPU solve does: stop when ||diff||^2 <= tol^2 ||out||^2, or when a norm is no longer
// finite (a diverged solve; the stats then hold inf or NaN, never a false convergence).
DIGNN_KERNEL(kFinalizeThreads) finalize_step_kernel(const double* norms_a, int64_t blocks_a,
                                                    const double* norms_b, int64_t blocks_b,
                                                    double* stats, int32_t* converged,
                                                    int64_t iteration, double tol,
                                                    int32_t last) {
  const int t = simt::thread_idx();
  double diff = 0.0, out = 0.0;
  strided_pair_sum(norms_a, blocks_a, t, diff, out);
  strided_pair_sum(norms_b, blocks_b, t, diff, out);
  block_sum2<kFinalizeThreads>(diff, out);
  if (t == 0 && (last != 0 || *converged == 0)) {
    const double res = ::sqrt(diff);
    stats[0] = *converged != 0 ? stats[0] + 1.0 : static_cast<double>(iteration);
    stats[1] = res;
    stats[2] = out > 0.0 ? res / ::sqrt(out) : 0.0;
    const bool finite = diff <= 1.7976931348623157e308 && out <= 1.7976931348623157e308;
    if (!finite || diff <= tol * tol * out) *converged = 1;
  }
}

// The row product's dots (launch_row_product_dots, launch.h): one block per channel c sums
// column c of the block table, then out_ic y_ic of the heavy rows, thread t taking the entries
// t, t + kCudaReduceThreads, ... of each, then the fixed tree of block_sum2.
template <typename T>
DIGNN_KERNEL(kCudaReduceThreads) row_product_dots_kernel(const double* dots, int64_t main_blocks,
                                                         const ScheduleView sched, const T* y,
                                                         const T* out, int64_t d,
                                                         const double* done, T* result) {
  const int64_t c = simt::block_idx();
  const int t = simt::thread_idx();
  double sum = 0.0, unused = 0.0;
  if (*done == 0.0) {
    for (int64_t b = t; b < main_blocks; b += kCudaReduceThreads) sum += dots[b * d + c];
    const int64_t heavy = sched_total(sched, kScheduleHeavyRows);
    for (int64_t r = t; r < heavy; r += kCudaReduceThreads) {
      const int64_t i = sched.heavy_row[r];
      sum += static_cast<double>(out[i * d + c]) * y[i * d + c];
    }
  }
  block_sum2<kCudaReduceThreads>(sum, unused);
  if (t == 0) result[c] = static_cast<T>(sum);
}

template <typename T>
int run_row_coefficients(const T* chi, const T* kappa, T inv_mu, int64_t n, T* cy, T* rs,
                         simt::Stream stream) {
  return simt::launch(&row_coefficients_kernel<T>, ceil_div(n, kCudaReduceThreads),
                      kCudaReduceThreads, stream, chi, kappa, inv_mu, n, cy, rs);
}

template <typename T>
int run_row_sums(const int64_t* rowptr, const T* values, int64_t n, T* out,
                 simt::Stream stream) {
  return simt::launch(&row_sums_kernel<T>, ceil_div(n, kCudaBlockThreads / kCudaWarpLanes),
                      kCudaBlockThreads, stream, rowptr, values, n, out);
}

template <typename T, typename S>
int run_sum_squares(const S* x, int64_t count, double* block_norms, simt::Stream stream) {
  return simt::launch(&sum_squares_kernel<T, S>, sum_squares_blocks_impl(count),
                      kCudaReduceThreads, stream, x, count, block_norms);
}

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
