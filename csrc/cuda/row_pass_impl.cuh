// The forward/adjoint row pass of the fixed-point iteration (eq. iter) on the GPU, with cached
// edge weights or with the neural weights (eq. 13-14) made in the same sweep. See launch.h for
// the work decomposition, 16-bit storage and RowPassArgs for the contract; math in
// laplacian_math.h.
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

// Copies row y_i, stored as S, to out_i, stored as O (a converged solve carries its result
// forward).
template <typename S, typename O, int V, int G>
DIGNN_DEV void carry_row(const S* y_i, O* out_i, int64_t nvec, int lane) {
  for (int64_t vi = lane; vi < nvec; vi += G) {
    store<O, V>(out_i + vi * V, converted<O>(load_ro<S, V>(y_i + vi * V)));
  }
}

// The row product's sums of one block (RowPassArgs): lane_dots holds out_ic y_ic of the lane's
// channels of its group's row (0 where it has none: a heavy row's segment, no segment); they
// are summed over the groups in group order, per channel of the launch's channel block, into
// the block's row of the dots table. Every thread of the block must call it.
template <int kGroups, int G, int V>
DIGNN_DEV void store_block_dots(const double (&lane_dots)[kCudaVecsPerLane][V], int lane,
                                int group_in_block, int64_t first_channel, int64_t d,
                                double* dots) {
  constexpr int kWidth = G * kCudaVecsPerLane * V;  // channels of one channel block
  DIGNN_SHARED double s_dots[kGroups][kWidth];
  DIGNN_UNROLL
  for (int t = 0; t < kCudaVecsPerLane; ++t) {
    DIGNN_UNROLL
    for (int c = 0; c < V; ++c) s_dots[group_in_block][(lane + t * G) * V + c] = lane_dots[t][c];
  }
  simt::sync_block();
  const int64_t count = min_of<int64_t>(kWidth, d - first_channel);
  for (int64_t k = simt::thread_idx(); k < count; k += kCudaBlockThreads) {
    double sum = 0.0;
    for (int g = 0; g < kGroups; ++g) sum += s_dots[g][k];
    dots[simt::block_idx() * d + first_channel + k] = sum;
  }
}

// One segment (a whole row, or a part of a heavy row) per group of G lanes; y stored as S
// (16-bit S: cached weights only), out as O (RowPassArgs). kDots: the row product
// (RowPassArgs), one channel block.
template <typename T, typename S, typename O, int V, int G, bool kNeural, bool kDots>
DIGNN_KERNEL(kCudaBlockThreads) row_pass_kernel(const RowPassArgs<T, S, O> A) {
  constexpr int kGroups = kCudaBlockThreads / G;
  constexpr int64_t kBlockVecs = G * kCudaVecsPerLane;
  static_assert(G % kCudaRowUnroll == 0, "a batch of edges lies within the group's G edges");
  static_assert(!(kDots && kNeural), "the row product has cached weights");
  if (kDots && *A.done != 0.0) return;  // the whole grid returns: nothing written
  const Group<G> grp;
  const int lane = grp.lane;
  const int group_in_block = simt::thread_idx() / G;
  const int64_t segment = simt::block_idx() * kGroups + group_in_block;
  T row_diff = T(0), row_out = T(0);
  double lane_dots[kCudaVecsPerLane][V] = {};  // kDots: out_ic y_ic of the lane's channels
  // The channel blocks of this launch: all, or the row product's one.
  const int64_t cb_first = kDots ? A.channel_block * kBlockVecs : 0;

  if (segment < sched_total(A.sched, kScheduleSegments)) {
    const Segment sg = resolve_segment(A.sched, A.rowptr, segment);
    const int64_t i = sg.row;
    const bool heavy = sg.nseg > 1;
    const bool carry = A.converged != nullptr && *A.converged != 0;
    const int64_t d = A.d;
    const int64_t nvec = A.y != nullptr ? d / V : 0;
    const S* y_i = A.y + i * d;
    O* out_i = A.out + i * d;

    if (!kNeural && carry) {  // converged: out = y (heavy rows: in the combine kernel)
      if (!heavy) carry_row<S, O, V, G>(y_i, out_i, nvec, lane);
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
      for (int64_t cb = cb_first; cb == cb_first || (!kDots && cb < nvec); cb += kBlockVecs) {
        const bool make_w = kNeural && cb == 0;
        Pack<T, V> acc[kCudaVecsPerLane];
        DIGNN_UNROLL
        for (int t = 0; t < kCudaVecsPerLane; ++t) acc[t] = zero_pack<T, V>();
        // Making weights: row i's vectors of p and q in channel block 0, held over the edges.
        const int64_t nvec_h = A.h / V;
        const T* p_i = A.p + i * A.h;
        const T* q_i = A.q + i * A.h;
        Pack<T, V> pi_blk[kCudaVecsPerLane], qi_blk[kCudaVecsPerLane];
        load_lane_block<T, V, G>(p_i, nvec_h, 0, lane, make_w, pi_blk);
        load_lane_block<T, V, G>(q_i, nvec_h, 0, lane, make_w, qi_blk);

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
            for (int u = 0; u < kCudaRowUnroll; ++u) j[u] = grp.bcast(j_lane, eb + u);
            if (!make_w) {
              DIGNN_UNROLL
              for (int u = 0; u < kCudaRowUnroll; ++u) wt[u] = grp.bcast(val_lane, eb + u);
            }
            // Every neighbour-row load of the batch before any math: y_j over this lane's
            // vectors of block cb and, making weights, p_j and q_j over those of block 0.
            Pack<T, V> yv[kCudaRowUnroll][kCudaVecsPerLane];
            load_batch_block<T, V, G>(A.y, d, nvec, cb, lane, j, valid, yv);
            if (make_w) {  // eq. 13-14, and kappa_i = sum_k W_k in edge order
              Pack<T, V> pj[kCudaRowUnroll][kCudaVecsPerLane], qj[kCudaRowUnroll][kCudaVecsPerLane];
              load_batch_block<T, V, G>(A.p, A.h, nvec_h, 0, lane, j, valid, pj);
              load_batch_block<T, V, G>(A.q, A.h, nvec_h, 0, lane, j, valid, qj);
              T pi[kCudaRowUnroll], r2[kCudaRowUnroll];
              edge_metrics<T, V, G>(grp, A.p, A.q, A.h, p_i, q_i, pi_blk, qi_blk, pj, qj, j,
                                    valid, pi, r2);
              // lane eb + u makes the weight of its edge u, the group reads them back
              const int own = lane - eb;
              const T w_own =
                  neural_edge_weight(val_lane, edge_value_of_lane(pi, own),
                                     dignn_sqrt(edge_value_of_lane(r2, own)), A.eps);
              if (own >= 0 && own < kCudaRowUnroll) w_mine = w_own;
              DIGNN_UNROLL
              for (int u = 0; u < kCudaRowUnroll; ++u) {
                const T w = grp.bcast(w_own, eb + u);
                wt[u] = u < valid ? w : T(0);
                kappa += wt[u];
              }
            }
            if (nvec > 0) {  // acc += w_k y_j over this lane's channel vectors
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
              rs = rc.rs;
            }
          } else if (lane == 0) {
            A.partial_kappa[sg.slot] = kappa;
          }
        }
        if (nvec > 0) {
          if (!heavy) {  // out_i = b_i + cy y_i + rs (W y)_i, and the step norms (or dots)
            const T* b_i = kDots ? nullptr : A.b + i * d;  // the row product has none
            DIGNN_UNROLL
            for (int t = 0; t < kCudaVecsPerLane; ++t) {
              const int64_t vi = cb + lane + t * G;
              if (vi < nvec) {
                const Pack<T, V> yi = load_ro_as<T, V>(y_i + vi * V);
                Pack<T, V> o = yi;
                if (kDots) {  // b = 0
                  DIGNN_UNROLL
                  for (int c = 0; c < V; ++c) {
                    o.v[c] = cy * yi.v[c] + rs * acc[t].v[c];
                    lane_dots[t][c] = static_cast<double>(o.v[c]) * yi.v[c];
                  }
                } else if (!carry) {
                  const Pack<T, V> bi = load_ro<T, V>(b_i + vi * V);
                  DIGNN_UNROLL
                  for (int c = 0; c < V; ++c) o.v[c] = bi.v[c] + cy * yi.v[c] + rs * acc[t].v[c];
                  const Pack<T, V> r = as_stored<O>(o);  // the norms are of o as stored
                  DIGNN_UNROLL
                  for (int c = 0; c < V; ++c) {
                    const T diff = r.v[c] - yi.v[c];
                    lane_diff += diff * diff;
                    lane_out += r.v[c] * r.v[c];
                  }
                }
                store_as<T, V>(out_i + vi * V, o);
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
  if constexpr (kDots) {
    store_block_dots<kGroups, G, V>(lane_dots, lane, group_in_block, cb_first * V, A.d,
                                    A.dots);
  }
}

// Finishes the heavy rows: one warp per row sums its segments' partials in segment order.
// kDots: the row product (RowPassArgs), every channel.
template <typename T, typename S, typename O, bool kNeural, bool kDots>
DIGNN_KERNEL(kCudaBlockThreads) row_combine_kernel(const RowPassArgs<T, S, O> A) {
  constexpr int kGroups = kCudaBlockThreads / 32;
  if (kDots && *A.done != 0.0) return;  // the whole grid returns: nothing written
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
        rs = rc.rs;
      }
    } else {
      cy = A.cy[i];
      rs = A.rs != nullptr ? A.rs[i] : T(1);
    }
    T lane_diff = T(0), lane_out = T(0);
    for (int64_t c = lane; c < d; c += 32) {
      const T yi = static_cast<T>(A.y[i * d + c]);
      T o = yi;
      if (kDots) {  // b = 0; the dots of the row: launch_row_product_dots
        T acc = T(0);
        for (int64_t s = 0; s < nseg; ++s) acc += A.partial[(slot0 + s) * d + c];
        o = cy * yi + rs * acc;
      } else if (!carry) {
        T acc = T(0);
        for (int64_t s = 0; s < nseg; ++s) acc += A.partial[(slot0 + s) * d + c];
        o = A.b[i * d + c] + cy * yi + rs * acc;
        const T r = static_cast<T>(static_cast<O>(o));  // o as stored
        const T diff = r - yi;
        lane_diff += diff * diff;
        lane_out += r * r;
      }
      A.out[i * d + c] = static_cast<O>(o);
    }
    row_diff = grp.sum(lane_diff);
    row_out = grp.sum(lane_out);
  }
  if (A.combine_norms != nullptr) {
    store_block_norms<kGroups>(static_cast<double>(row_diff), static_cast<double>(row_out),
                               lane, group_in_block, A.combine_norms);
  }
}

// The segment kernel (the row product: once per channel block), then the heavy-row kernel.
// The neural kernels and the row product's are compiled for S == O == T only.
template <typename T, typename S, typename O>
int launch_row_pass(const RowPassArgs<T, S, O>& A, simt::Stream stream) {
  constexpr bool kSame = std::is_same<S, T>::value && std::is_same<O, T>::value;
  if ((A.neural || A.dots != nullptr) && !kSame) return 1;  // cudaErrorInvalidValue
  const bool neural = kSame && A.neural;
  const bool dots = kSame && A.dots != nullptr;
  const int status = launch_with_shape<T>(A.plan, [&](auto vec, auto group) {
    constexpr int V = decltype(vec)::value, G = decltype(group)::value;
    if (dots) {
      const int64_t nvec = A.d / V;
      RowPassArgs<T, S, O> B = A;
      for (B.channel_block = 0; B.channel_block * G * kCudaVecsPerLane < nvec;
           ++B.channel_block) {
        const int s = simt::launch(&row_pass_kernel<T, S, O, V, G, false, kSame>,
                                   A.plan.main_blocks, kCudaBlockThreads, stream, B);
        if (s != 0) return s;
      }
      return 0;
    }
    const auto kernel = neural ? &row_pass_kernel<T, S, O, V, G, kSame, false>
                               : &row_pass_kernel<T, S, O, V, G, false, false>;
    return simt::launch(kernel, A.plan.main_blocks, kCudaBlockThreads, stream, A);
  });
  if (status != 0) return status;
  const auto combine = neural ? &row_combine_kernel<T, S, O, kSame, false>
                              : (dots ? &row_combine_kernel<T, S, O, false, kSame>
                                      : &row_combine_kernel<T, S, O, false, false>);
  return simt::launch(combine, A.plan.combine_blocks, kCudaBlockThreads, stream, A);
}

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
