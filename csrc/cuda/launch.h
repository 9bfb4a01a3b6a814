// What the host code of the CUDA ops (csrc/cuda/device_*.h) hands to the kernels: plain
// argument structs, the launch plan, and the launchers. No ATen here (only c10's 16-bit float
// types), so that the .cu files compile quickly; the math is in csrc/dignn/laplacian_math.h,
// the schedule's vocabulary and constants in csrc/dignn/schedule.h.
//
// Work decomposition (the same for every CSR pass):
// - The *schedule* (segments and heavy rows, schedule.h) is built once per op call from rowptr
//   alone, on the device, without a host sync: row i is cut into
//   nseg_i = max(1, ceil(deg_i / kSegmentEdges)) segments. A row of 10,000 neighbours is ~80
//   segments spread over the GPU.
// - A segment is processed by a *group* of G consecutive lanes of a warp (G = 4, 8, 16 or 32,
//   the smallest that covers the channels with kCudaVecsPerLane vectors per lane), so short
//   rows do not leave most of a warp idle. Each lane holds channel vectors of V elements (V = 4
//   for float32 when every row is 16-byte aligned: one 16-byte load per lane per vector), and
//   the group gathers kCudaRowUnroll (kCudaGradUnroll) neighbour rows at a time to keep
//   several loads in flight.
// - 16-bit storage (csrc/ops/storage.h): the row pass's iterates y, out and the gradient pass's
//   z, v may be stored as S = c10::BFloat16 or c10::Half with T = float. Each load is widened
//   exactly to T, where every sum runs; the row pass rounds its output to nearest even on the
//   store (c10's conversions, as torch's .to() on the same device). V = 4 then loads 8 bytes.
// - The segments of a heavy row write their partial sums to one slot each; a second kernel
//   adds the slots of each heavy row in segment order and finishes the row.
// - Sums over rows (the residual norms of a solve) are reduced per block in group order and
//   then over blocks in block order by one final block: fixed order, no atomics.
#pragma once

#include <cstdint>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "cuda/simt.cuh"
#include "dignn/schedule.h"

namespace dignn {
namespace DIGNN_SIMT_NS {

// Edges per segment: kCudaSegmentEdges. The host emulator used by the tests builds with a small
// DIGNN_SEGMENT_EDGES, so that its small graphs take the heavy-row paths too.
#ifdef DIGNN_SEGMENT_EDGES
constexpr int64_t kSegmentEdges = DIGNN_SEGMENT_EDGES;
#else
constexpr int64_t kSegmentEdges = kCudaSegmentEdges;
#endif

// The columns of ScheduleView::incl.
constexpr int kScheduleSegments = 0;
constexpr int kScheduleHeavySlots = 1;
constexpr int kScheduleHeavyRows = 2;

// The segments of one CSR, built by make_device_csr (device_csr.h).
struct ScheduleView {
  const int64_t* incl;         // [3][n] inclusive sums over rows of: segments, heavy-row slots,
                               // heavy rows (one per heavy row)
  const int32_t* segment_row;  // [max_segments] the row of each segment
  const int32_t* heavy_row;    // [max_heavy_rows] the heavy rows, in row order
  int64_t n;
};

// Upper bounds on the schedule's sizes that the host knows without reading the device:
// sum_i max(1, ceil(deg_i/E)) <= n + m/E; a heavy row (deg > E) has ceil(deg/E) <= 2 floor(deg/E)
// segments, so all heavy slots <= 2 m/E; heavy rows <= m/(E+1).
inline int64_t max_segments(int64_t n, int64_t m) { return n + m / kSegmentEdges; }
inline int64_t max_heavy_slots(int64_t m) { return 2 * (m / kSegmentEdges) + 1; }
inline int64_t max_heavy_rows(int64_t m) { return m / (kSegmentEdges + 1) + 1; }

// Lanes per group: the smallest power of two from kCudaMinGroupLanes whose kCudaVecsPerLane
// vectors per lane cover `vecs` channel vectors (a whole warp beyond; wider rows are done in
// several channel blocks).
inline int group_size(int64_t vecs) {
  for (int g = kCudaMinGroupLanes; g < kCudaWarpLanes; g *= 2) {
    if (g * kCudaVecsPerLane >= vecs) return g;
  }
  return kCudaWarpLanes;
}

DIGNN_HOST_DEV int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// How one pass is launched; filled in by the host (plan_pass).
struct PassPlan {
  int group = 32;              // lanes per group
  int vec = 1;                 // elements per channel vector (1, or 4 for aligned float32)
  int64_t main_blocks = 0;     // blocks of the segment kernel
  int64_t combine_blocks = 0;  // blocks of the heavy-row kernel (one warp per heavy row)
};

inline PassPlan plan_pass(int64_t n, int64_t m, int64_t widest_vecs, int vec) {
  PassPlan plan;
  plan.vec = vec;
  plan.group = group_size(widest_vecs);
  plan.main_blocks = n > 0 ? ceil_div(max_segments(n, m), kCudaBlockThreads / plan.group) : 0;
  plan.combine_blocks = n > 0 ? ceil_div(max_heavy_rows(m), kCudaBlockThreads / 32) : 0;
  return plan;
}

// One CSR row pass: out_i = b_i + cy_i y_i + rs_i sum_k w_k y_{col_k}  (eq. iter), with
// - cached weights (neural = false): w given, cy and rs per row (rs null: 1);
// - the neural Laplacian (neural = true): w_k = a_k tanh(1/(||q_i - q_j|| + eps)) tanh(|p_i.p_j|)
//   (eq. 13-14) computed in the pass and written to w_out, kappa_i = sum_k w_k to kappa_out, and
//   (cy, rs) = row_coefficients(chi_i, kappa_i, inv_mu) when chi is given. With y null only the
//   weights and kappa are made (neural_edge_weights).
// With `converged` set on the device, the pass only carries y forward (out = y) and adds nothing
// to the norms; the weights of a neural pass are still made. y is stored as S (a 16-bit S
// only with cached weights), out as O: S, or T for the wide last iteration of a 16-bit solve
// (csrc/ops/solve.h; cached weights, no row product).
// The row product of a cg solve (`dots` set; cached weights, S == T, b null: b = 0): each launch
// of the segment kernel makes the channels of one channel block (`channel_block`, of
// G * kCudaVecsPerLane vectors), with the block's per-channel sums of out_i y_i over its rows
// other than heavy ones (in float64, the products exact) in dots[block][channel];
// launch_row_product_dots adds them up with the heavy rows' products. Once the float64 flag
// `done` is set (cg's flags), the kernels write nothing.
template <typename T, typename S = T, typename O = S>
struct RowPassArgs {
  bool neural = false;  // neural weights made in the pass (else cached w)
  const int64_t* rowptr = nullptr;
  const int32_t* col = nullptr;
  int64_t n = 0, m = 0;
  ScheduleView sched{};
  const T* w = nullptr;
  const T* a = nullptr;
  const T* p = nullptr;
  const T* q = nullptr;
  int64_t h = 0;
  T eps = T(0);
  T* w_out = nullptr;
  T* kappa_out = nullptr;
  const T* b = nullptr;
  const S* y = nullptr;
  O* out = nullptr;
  int64_t d = 0;
  const T* cy = nullptr;
  const T* rs = nullptr;
  const T* chi = nullptr;
  T inv_mu = T(0);
  T* partial = nullptr;        // [max_heavy_slots][d]: W y over one segment of a heavy row
  T* partial_kappa = nullptr;  // [max_heavy_slots]: kappa over one segment (neural)
  const int32_t* converged = nullptr;
  double* main_norms = nullptr;     // [main_blocks][2]: ||out - y||^2, ||out||^2 (or null)
  double* combine_norms = nullptr;  // [combine_blocks][2]
  const double* done = nullptr;     // row product: a cg solve's flag
  double* dots = nullptr;           // row product: [main_blocks][d]
  int64_t channel_block = 0;        // row product: the channel block of this launch
  PassPlan plan{};
};

// How dl/dW_ij of an edge is known in the gradient pass.
enum EdgeGradMode : int {
  kEdgeGradGiven = 0,      // per edge, in this CSR's order (neural_edge_weights backward)
  kEdgeGradSymmetric = 1,  // (v_i - v_j).(z_j - z_i): G_ij + G_ji of a symmetric graph
  kEdgeGradOut = 2,        // v_i.(z_j - z_i): edge (i, j), node i first argument of W_ij
  kEdgeGradIn = 3,         // v_j.(z_i - z_j): transposed row i, edge (j, i), i second argument
};

// One CSR pass of the gradient of the neural edge weights (laplacian_math.h):
//   grad_p_i (+)= sum_k cp_k p_{j_k},  grad_q_i (+)= sum_k cq_k (q_i - q_{j_k}),
//   cp = G dW/dpi,  cq = G (dW/drho) / rho.  z and v are stored as S.
template <typename T, typename S = T>
struct NeuralWeightGradArgs {
  const int64_t* rowptr = nullptr;
  const int32_t* col = nullptr;
  int64_t n = 0, m = 0;
  ScheduleView sched{};
  const T* a = nullptr;  // edge values in this CSR's order
  const T* p = nullptr;
  const T* q = nullptr;
  int64_t h = 0;
  T eps = T(0);
  int mode = kEdgeGradGiven;
  const T* given = nullptr;  // kEdgeGradGiven: dl/dW per edge in this CSR's order
  const S* z = nullptr;
  const S* v = nullptr;
  int64_t d = 0;
  bool accumulate = false;  // add to grad_p, grad_q instead of overwriting them
  T* grad_p = nullptr;
  T* grad_q = nullptr;
  T* partial = nullptr;       // [max_heavy_slots][2h + 4]: sum cp p_j, sum cq q_j, sum cq
  T* edge_scratch = nullptr;  // [m][2] (cp, cq) when h spans several channel blocks
  PassPlan plan{};
};

DIGNN_HOST_DEV int64_t grad_partial_stride(int64_t h) { return 2 * h + 4; }

// Launchers (csrc/cuda/*.cu). Each returns the launch status (0 = success).
template <typename T, typename S, typename O>
int launch_row_pass(const RowPassArgs<T, S, O>& args, simt::Stream stream);
template <typename T, typename S>
int launch_neural_weight_grad(const NeuralWeightGradArgs<T, S>& args, simt::Stream stream);
// Their instantiations for float and double, and float with 16-bit storage, each in its own .cu
// file (compiled in parallel).
#define DIGNN_INSTANTIATE_PASS_LAUNCHER(LAUNCHER, ARGS)                                     \
  template int LAUNCHER<float, float>(const ARGS<float, float>&, simt::Stream);             \
  template int LAUNCHER<double, double>(const ARGS<double, double>&, simt::Stream);         \
  template int LAUNCHER<float, c10::BFloat16>(const ARGS<float, c10::BFloat16>&,            \
                                              simt::Stream);                                \
  template int LAUNCHER<float, c10::Half>(const ARGS<float, c10::Half>&, simt::Stream);
// The row pass also reads 16-bit iterates into a float32 output (a 16-bit solve's wide last
// iteration).
#define DIGNN_INSTANTIATE_ROW_PASS_LAUNCHER                                                  \
  DIGNN_INSTANTIATE_PASS_LAUNCHER(launch_row_pass, RowPassArgs)                            \
  template int launch_row_pass<float, c10::BFloat16, float>(                               \
      const RowPassArgs<float, c10::BFloat16, float>&, simt::Stream);                      \
  template int launch_row_pass<float, c10::Half, float>(                                   \
      const RowPassArgs<float, c10::Half, float>&, simt::Stream);

int launch_schedule_counts(const int64_t* rowptr, int64_t n, int64_t* counts,
                           simt::Stream stream);
int launch_schedule_fill(const int64_t* incl, int64_t n, int32_t* segment_row,
                         int32_t* heavy_row, simt::Stream stream);
template <typename T>
int launch_row_coefficients(const T* chi, const T* kappa, T inv_mu, int64_t n, T* cy, T* rs,
                            simt::Stream stream);
template <typename T>
int launch_row_sums(const int64_t* rowptr, const T* values, int64_t n, T* out,
                    simt::Stream stream);
// Blocks that sum_squares writes partial sums for (a function of the element count only).
int64_t sum_squares_blocks(int64_t count);
// ||x||^2 as block sums, x stored as S (T, or 16 bits with T = float), squares in T.
template <typename T, typename S>
int launch_sum_squares(const S* x, int64_t count, double* block_norms, simt::Stream stream);
// The row product's dots (RowPassArgs) from the block table of its pass, its input y and its
// output out: result[c] = the sum over the main_blocks rows of `dots`, then of out_ic y_ic over
// the heavy rows i of the schedule (their number read on the device; few: each has more than
// kSegmentEdges edges), in that fixed order; 0 once the flag `done` is set.
template <typename T>
int launch_row_product_dots(const double* dots, int64_t main_blocks, ScheduleView sched,
                            const T* y, const T* out, int64_t d, const double* done,
                            T* result, simt::Stream stream);
// stats = [iteration, sqrt(sum diff), sqrt(sum diff / sum out)] and converged = (sum diff <=
// tol^2 sum out) from the block sums of one step, unless `converged` was already set. `last`:
// the wide last iteration of a 16-bit solve (csrc/ops/solve.h), whose stats are written in
// any case, as iteration stats[0] + 1 (the one after the solve stopped) if it had converged.
int launch_finalize_step(const double* norms_a, int64_t blocks_a, const double* norms_b,
                         int64_t blocks_b, double* stats, int32_t* converged, int64_t iteration,
                         double tol, bool last, simt::Stream stream);

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
