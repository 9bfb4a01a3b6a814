// Launchers of the small kernels (small_kernels_impl.cuh).
#include "cuda/small_kernels_impl.cuh"

namespace dignn {
namespace DIGNN_SIMT_NS {

int launch_schedule_counts(const int64_t* rowptr, int64_t n, int64_t* counts,
                           simt::Stream stream) {
  return simt::launch(&schedule_counts_kernel, ceil_div(n, kCudaReduceThreads),
                      kCudaReduceThreads, stream, rowptr, n, counts);
}

int launch_schedule_fill(const int64_t* incl, int64_t n, int32_t* segment_row,
                         int32_t* heavy_row, simt::Stream stream) {
  return simt::launch(&schedule_fill_kernel, ceil_div(n, kCudaReduceThreads),
                      kCudaReduceThreads, stream, incl, n, segment_row, heavy_row);
}

template <typename T>
int launch_row_coefficients(const T* chi, const T* kappa, T inv_mu, int64_t n, T* cy, T* rs,
                            simt::Stream stream) {
  return run_row_coefficients<T>(chi, kappa, inv_mu, n, cy, rs, stream);
}

template <typename T>
int launch_row_sums(const int64_t* rowptr, const T* values, int64_t n, T* out,
                    simt::Stream stream) {
  return run_row_sums<T>(rowptr, values, n, out, stream);
}

int64_t sum_squares_blocks(int64_t count) { return sum_squares_blocks_impl(count); }

template <typename T, typename S>
int launch_sum_squares(const S* x, int64_t count, double* block_norms, simt::Stream stream) {
  return run_sum_squares<T, S>(x, count, block_norms, stream);
}

int launch_finalize_step(const double* norms_a, int64_t blocks_a, const double* norms_b,
                         int64_t blocks_b, double* stats, int32_t* converged, int64_t iteration,
                         double tol, bool last, simt::Stream stream) {
  return simt::launch(&finalize_step_kernel, 1, kFinalizeThreads, stream, norms_a, blocks_a,
                      norms_b, blocks_b, stats, converged, iteration, tol,
                      static_cast<int32_t>(last));
}

template <typename T>
int launch_row_product_dots(const double* dots, int64_t main_blocks, ScheduleView sched,
                            const T* y, const T* out, int64_t d, const double* done, T* result,
                            simt::Stream stream) {
  return simt::launch(&row_product_dots_kernel<T>, d, kCudaReduceThreads, stream, dots,
                      main_blocks, sched, y, out, d, done, result);
}

#define DIGNN_SMALL_KERNELS(T)                                                              \
  template int launch_row_coefficients<T>(const T*, const T*, T, int64_t, T*, T*,           \
                                          simt::Stream);                                    \
  template int launch_row_sums<T>(const int64_t*, const T*, int64_t, T*, simt::Stream);     \
  template int launch_sum_squares<T, T>(const T*, int64_t, double*, simt::Stream);       \
  template int launch_row_product_dots<T>(const double*, int64_t, ScheduleView, const T*, \
                                          const T*, int64_t, const double*, T*,           \
                                          simt::Stream);
DIGNN_SMALL_KERNELS(float)
DIGNN_SMALL_KERNELS(double)
#undef DIGNN_SMALL_KERNELS
// Iteration 1 of a 16-bit solve: the norms of Y_1 = round(B) as stored.
template int launch_sum_squares<float, c10::BFloat16>(const c10::BFloat16*, int64_t, double*,
                                                      simt::Stream);
template int launch_sum_squares<float, c10::Half>(const c10::Half*, int64_t, double*,
                                                  simt::Stream);

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
