// The forward/adjoint row pass of the fixed-point iteration (eq. iter) on the GPU, with cached
// edge weights or with the neural weights (eq. 13-14) made in the same sweep. See launch.h for
// the work decomposition and RowPassArgs for the contract; math in laplacian_math.h.
#pragma once

#include "cuda/device_common.cuh"

namespace dignn {
namespace DIGNN_SIMT_NS {

// One lane's edge of a batch of G edges: its column and a per-edge value.
template <typename T>
struct EdgeSlot {
  int32_t j;
  T val;
};

// Copies row y_i to out_i (a converged solve carries its result forward).
template <typename T, int V, int G>
DIGNN_DEV void carry_row(const T* y_i, T* out_i, int64_t nvec, int lane) {
  for (int64_t vi = lane; vi < nvec; vi += G) {
    store<T, V>(out_i + vi * V, load_ro<T, V>(y_i + vi * V));
  }
}

// pi_u = p_i . p_{j_u} and r2_u = ||q_i - q_{j_u}||^2 for the kCudaRowUnroll edges of a
// batch (only the first `valid` are real), summed over the group: identical in every lane.
template <typename T, int V, int G>
DIGNN_DEV void edge_metrics(const Group<G>& grp, const T* p, const T* q, int64_t h, int64_t row,
                            const int32_t (&j)[kCudaRowUnroll], int valid,
                            T (&pi)[kCudaRowUnroll], T (&r2)[kCudaRowUnroll]) {
  DIGNN_UNROLL
  for (int u = 0; u < kCudaRowUnroll; ++u) pi[u] = r2[u] = T(0);
  const int64_t nvec_h = h / V;
  const T* p_i = p + row * h;
  const T* q_i = q + row * h;
  for (int64_t vh = grp.lane; vh < nvec_h; vh += G) {
    const Pack<T, V> pv = load_ro<T, V>(p_i + vh * V);
    const Pack<T, V> qv = load_ro<T, V>(q_i + vh * V);
    Pack<T, V> pj[kCudaRowUnroll], qj[kCudaRowUnroll];
    DIGNN_UNROLL
    for (int u = 0; u < kCudaRowUnroll; ++u) {
      if (u < valid) {
        pj[u] = load_ro<T, V>(p + static_cast<int64_t>(j[u]) * h + vh * V);
        qj[u] = load_ro<T, V>(q + static_cast<int64_t>(j[u]) * h + vh * V);
      } else {
        pj[u] = qj[u] = zero_pack<T, V>();
      }
    }
    DIGNN_UNROLL
    for (int u = 0; u < kCudaRowUnroll; ++u) {
      add_edge_metrics<T, V>(pv, pj[u], qv, qj[u], pi[u], r2[u]);
    }
  }
  DIGNN_UNROLL
  for (int u = 0; u < kCudaRowUnroll; ++u) {
    pi[u] = grp.sum(pi[u]);
    r2[u] = grp.sum(r2[u]);
  }
}

// One segment (a whole row, or a part of a heavy row) per group of G lanes.
template <typename T, int V, int G, bool kNeural>
DIGNN_KERNEL(kCudaBlockThreads) row_pass_kernel(const RowPassArgs<T> A) {
  constexpr int kGroups = kCudaBlockThreads / G;
  constexpr int64_t kBlockVecs = G * kCudaVecsPerLane;
  const Group<G> grp;
  const int lane = grp.lane;
  const int group_in_block = simt::thread_idx() / G;
  const int64_t segment = simt::block_idx() * kGroups + group_in_block;
  T row_diff = T(0), row_out = T(0);

  if (segment < sched_total(A.sched, kScheduleSegments)) {
    const Segment sg = resolve_segment(A.sched, A.rowptr, segment);
    const int64_t i = sg.row;
    const bool heavy = sg.nseg > 1;
    const bool carry = A.converged != nullptr && *A.converged != 0;
    const int64_t d = A.d;
    const int64_t nvec = A.y != nullptr ? d / V : 0;
    const T* y_i = A.y + i * d;
    T* out_i = A.out + i * d;

    if (!kNeural && carry) {  // converged: out = y (heavy rows: in the combine kernel)
      if (!heavy) carry_row<T, V, G>(y_i, out_i, nvec, lane);
    } else {
      T cy = T(0), rs = T(0);
      if (!kNeural) {
        cy = A.cy[i];
        rs = A.rs != nullptr ? A.rs[i] : T(1);
      }
      T kappa = T(0);
      T lane_diff = T(0), lane_out = T(0);
      // Channel blocks of G * kCudaVecsPerLane vectors (one block unless d is wide). The neural
      // weights are made in the first; later blocks read them back (each lane reads the
      // edges it wrote itself).
      for (int64_t cb = 0; cb == 0 || cb < nvec; cb += kBlockVecs) {
        const bool make_w = kNeural && cb == 0;
        Pack<T, V> acc[kCudaVecsPerLane];
        DIGNN_UNROLL
        for (int t = 0; t < kCudaVecsPerLane; ++t) acc[t] = zero_pack<T, V>();

        // The group takes G edges at a time: lane l holds edge kb + l (its column, and a when
        // making weights, else w), loaded one batch ahead.
        const auto edge_values = [&](int64_t e) {
          EdgeSlot<T> slot{0, T(0)};
          if (e < sg.k1) {
            slot.j = A.col[e];
            if (make_w) {
              slot.val = simt::ldg(A.a + e);
            } else if (kNeural) {
              slot.val = A.w_out[e];  // written by this lane in block 0
            } else {
              slot.val = simt::ldg(A.w + e);
            }
          }
          return slot;
        };
        for_each_edge_batch<G>(sg, lane, edge_values, [&](int64_t e, int count,
                                                          const EdgeSlot<T>& mine) {
          const bool edge_valid = e < sg.k1;
          const int32_t j_lane = mine.j;
          const T val_lane = mine.val;
          T w_mine = T(0);
          for (int eb = 0; eb < count; eb += kCudaRowUnroll) {
            const int valid = count - eb;  // edges eb + u with u < valid are real
            int32_t j[kCudaRowUnroll];
            T wt[kCudaRowUnroll];
            DIGNN_UNROLL
            for (int u = 0; u < kCudaRowUnroll; ++u) {
              j[u] = grp.bcast(j_lane, eb + u);
              wt[u] = grp.bcast(val_lane, eb + u);
            }
            if (make_w) {  // eq. 13-14, and kappa_i = sum_k W_k in edge order
              T pi[kCudaRowUnroll], r2[kCudaRowUnroll];
              edge_metrics<T, V, G>(grp, A.p, A.q, A.h, i, j, valid, pi, r2);
              DIGNN_UNROLL
              for (int u = 0; u < kCudaRowUnroll; ++u) {
                wt[u] = u < valid ? neural_edge_weight(wt[u], pi[u], dignn_sqrt(r2[u]), A.eps)
                                  : T(0);
                kappa += wt[u];
                if (lane == eb + u) w_mine = wt[u];
              }
            }
            if (nvec > 0) {  // acc += w_k y_j over this lane's channel vectors
              Pack<T, V> yv[kCudaRowUnroll][kCudaVecsPerLane];
              DIGNN_UNROLL
              for (int u = 0; u < kCudaRowUnroll; ++u) {
                const T* y_j = A.y + static_cast<int64_t>(j[u]) * d;
                DIGNN_UNROLL
                for (int t = 0; t < kCudaVecsPerLane; ++t) {
                  const int64_t vi = cb + lane + t * G;
                  yv[u][t] = (u < valid && vi < nvec) ? load_ro<T, V>(y_j + vi * V)
                                                      : zero_pack<T, V>();
                }
              }
              DIGNN_UNROLL
              for (int u = 0; u < kCudaRowUnroll; ++u) {
                DIGNN_UNROLL
                for (int t = 0; t < kCudaVecsPerLane; ++t) {
                  DIGNN_UNROLL
                  for (int c = 0; c < V; ++c) {
                    acc[t].v[c] = simt::madd(wt[u], yv[u][t].v[c], acc[t].v[c]);
                  }
                }
              }
            }
          }
          if (make_w && edge_valid) A.w_out[e] = w_mine;
        });

        if (make_w) {
          if (!heavy) {
            if (A.kappa_out != nullptr && lane == 0) A.kappa_out[i] = kappa;
            if (A.chi != nullptr) {
              const RowCoefficients<T> rc = row_coefficients(A.chi[i], kappa, A.inv_mu);
              cy = rc.cy;
              rs = rc.ca;
            }
          } else if (lane == 0) {
            A.partial_kappa[sg.slot] = kappa;
          }
        }
        if (nvec > 0) {
          if (!heavy) {  // out_i = b_i + cy y_i + rs (W y)_i, and the step norms
            const T* b_i = A.b + i * d;
            DIGNN_UNROLL
            for (int t = 0; t < kCudaVecsPerLane; ++t) {
              const int64_t vi = cb + lane + t * G;
              if (vi < nvec) {
                const Pack<T, V> yi = load_ro<T, V>(y_i + vi * V);
                Pack<T, V> o = yi;
                if (!carry) {
                  const Pack<T, V> bi = load_ro<T, V>(b_i + vi * V);
                  DIGNN_UNROLL
                  for (int c = 0; c < V; ++c) {
                    o.v[c] = bi.v[c] + cy * yi.v[c] + rs * acc[t].v[c];
                    const T diff = o.v[c] - yi.v[c];
                    lane_diff += diff * diff;
                    lane_out += o.v[c] * o.v[c];
                  }
                }
                store<T, V>(out_i + vi * V, o);
              }
            }
          } else {  // this segment's share of (W y)_i
            T* slot = A.partial + sg.slot * d;
            DIGNN_UNROLL
            for (int t = 0; t < kCudaVecsPerLane; ++t) {
              const int64_t vi = cb + lane + t * G;
              if (vi < nvec) store<T, V>(slot + vi * V, acc[t]);
            }
          }
        }
      }
      if (!heavy) {
        row_diff = grp.sum(lane_diff);
        row_out = grp.sum(lane_out);
      }
    }
  }
  if (A.main_norms != nullptr) {
    store_block_norms<kGroups>(static_cast<double>(row_diff), static_cast<double>(row_out),
                               lane, group_in_block, A.main_norms);
  }
}

// Finishes the heavy rows: one warp per row sums its segments' partials in segment order.
template <typename T, bool kNeural>
DIGNN_KERNEL(kCudaBlockThreads) row_combine_kernel(const RowPassArgs<T> A) {
  constexpr int kGroups = kCudaBlockThreads / 32;
  const Group<32> grp;
  const int lane = grp.lane;
  const int group_in_block = simt::thread_idx() / 32;
  const int64_t index = simt::block_idx() * kGroups + group_in_block;
  T row_diff = T(0), row_out = T(0);

  if (index < sched_total(A.sched, kScheduleHeavyRows)) {
    const int64_t i = A.sched.heavy_row[index];
    const int64_t first_segment = sched_before(A.sched, i, kScheduleSegments);
    const int64_t nseg = sched_upto(A.sched, i, kScheduleSegments) - first_segment;
    const int64_t slot0 = sched_before(A.sched, i, kScheduleHeavySlots);
    const bool carry = A.converged != nullptr && *A.converged != 0;
    const int64_t d = A.y != nullptr ? A.d : 0;
    T cy = T(0), rs = T(0);
    if (kNeural) {
      T kappa = T(0);
      for (int64_t s = 0; s < nseg; ++s) kappa += A.partial_kappa[slot0 + s];
      if (A.kappa_out != nullptr && lane == 0) A.kappa_out[i] = kappa;
      if (A.chi != nullptr) {
        const RowCoefficients<T> rc = row_coefficients(A.chi[i], kappa, A.inv_mu);
        cy = rc.cy;
        rs = rc.ca;
      }
    } else {
      cy = A.cy[i];
      rs = A.rs != nullptr ? A.rs[i] : T(1);
    }
    T lane_diff = T(0), lane_out = T(0);
    for (int64_t c = lane; c < d; c += 32) {
      const T yi = A.y[i * d + c];
      T o = yi;
      if (!carry) {
        T acc = T(0);
        for (int64_t s = 0; s < nseg; ++s) acc += A.partial[(slot0 + s) * d + c];
        o = A.b[i * d + c] + cy * yi + rs * acc;
        const T diff = o - yi;
        lane_diff += diff * diff;
        lane_out += o * o;
      }
      A.out[i * d + c] = o;
    }
    row_diff = grp.sum(lane_diff);
    row_out = grp.sum(lane_out);
  }
  if (A.combine_norms != nullptr) {
    store_block_norms<kGroups>(static_cast<double>(row_diff), static_cast<double>(row_out),
                               lane, group_in_block, A.combine_norms);
  }
}

// The segment kernel, then the heavy-row kernel.
template <typename T>
int launch_row_pass(const RowPassArgs<T>& A, simt::Stream stream) {
  const int status = launch_with_shape<T>(A.plan, [&](auto vec, auto group) {
    constexpr int V = decltype(vec)::value, G = decltype(group)::value;
    const auto kernel =
        A.neural ? &row_pass_kernel<T, V, G, true> : &row_pass_kernel<T, V, G, false>;
    return simt::launch(kernel, A.plan.main_blocks, kCudaBlockThreads, stream, A);
  });
  if (status != 0) return status;
  const auto combine = A.neural ? &row_combine_kernel<T, true> : &row_combine_kernel<T, false>;
  return simt::launch(combine, A.plan.combine_blocks, kCudaBlockThreads, stream, A);
}

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
