// The fused gradient pass of the neural edge weights on the GPU (laplacian_math.h, appendix
// "Training for DIGNNs"): per edge the scalar dl/dW (given, or formed in the row from the adjoint
// v and the equilibrium z), pi = p_i.p_j and rho = ||q_i - q_j|| computed by the group, then
//   grad_p_i (+)= sum_k cp_k p_j,  grad_q_i (+)= (sum_k cq_k) q_i - sum_k cq_k q_j
// with cp = G dW/dpi, cq = G (dW/drho) / rho, accumulated in registers over the row. On a
// symmetric graph one pass over row i covers both (i, j) and (j, i) (G_ij + G_ji); a directed
// graph takes a second pass over the transposed CSR. No atomics: every output row is written by
// the one group (or, for heavy rows, the one combining warp) that owns it.
#pragma once

#include "cuda/device_common.cuh"

namespace dignn {
namespace DIGNN_SIMT_NS {

// One lane's edge of a batch of G edges: its column and two per-edge values.
template <typename T>
struct GradEdgeSlot {
  int32_t j;
  T s0, s1;
};

// One segment per group of G lanes. kFormed: dl/dW is formed from v and z (A.mode one of
// kEdgeGradSymmetric, kEdgeGradOut, kEdgeGradIn; both stored as S), else given per edge
// (kEdgeGradGiven); a compile-time choice, so that neither kernel holds the other's registers.
template <typename T, typename S, int V, int G, bool kFormed>
DIGNN_KERNEL(kCudaBlockThreads) neural_weight_grad_kernel(const NeuralWeightGradArgs<T, S> A) {
  constexpr int kGroups = kCudaBlockThreads / G;
  constexpr int64_t kBlockVecs = G * kCudaVecsPerLane;
  constexpr int U = kCudaGradUnroll;
  static_assert(G % U == 0, "a batch of edges lies within the group's G edges");
  const Group<G> grp;
  const int lane = grp.lane;
  const int group_in_block = simt::thread_idx() / G;
  const int64_t segment = simt::block_idx() * kGroups + group_in_block;
  // (no block-wide barrier in this kernel)
  if (segment >= sched_total(A.sched, kScheduleSegments)) return;

  const Segment sg = resolve_segment(A.sched, A.rowptr, segment);
  const int64_t i = sg.row;
  const int64_t h = A.h;
  const int64_t nvec_h = h / V;
  const int64_t d = A.d;
  const int64_t nvec_d = kFormed ? d / V : 0;
  const T* p_i = A.p + i * h;
  const T* q_i = A.q + i * h;
  const S* v_i = kFormed ? A.v + i * d : nullptr;
  const S* z_i = kFormed ? A.z + i * d : nullptr;
  // A segment of a heavy row writes its sums to its slot of A.partial; null: the row is
  // finished here.
  T* const heavy_slot = sg.nseg > 1 ? A.partial + sg.slot * grad_partial_stride(h) : nullptr;

  for (int64_t cb = 0; cb == 0 || cb < nvec_h; cb += kBlockVecs) {
    // The edge scalars (cp, cq) are made in channel block 0; later blocks (h wider than a
    // block) read them back from edge_scratch, each lane the edges it wrote itself.
    const bool first = cb == 0;
    Pack<T, V> gp[kCudaVecsPerLane], gq[kCudaVecsPerLane];
    DIGNN_UNROLL
    for (int t = 0; t < kCudaVecsPerLane; ++t) gp[t] = gq[t] = zero_pack<T, V>();
    // Row i's vectors of channel block 0 (p, q, and v, z when dl/dW is formed), held over the
    // edges of block 0.
    Pack<T, V> pi_blk[kCudaVecsPerLane], qi_blk[kCudaVecsPerLane];
    Pack<T, V> vi_blk[kCudaVecsPerLane], zi_blk[kCudaVecsPerLane];
    load_lane_block<T, V, G>(p_i, nvec_h, 0, lane, first, pi_blk);
    load_lane_block<T, V, G>(q_i, nvec_h, 0, lane, first, qi_blk);
    load_lane_block<T, V, G>(v_i, nvec_d, 0, lane, first, vi_blk);
    load_lane_block<T, V, G>(z_i, nvec_d, 0, lane, first, zi_blk);
    T cq_sum = T(0);

    // Lane l holds edge kb + l: its column and, in block 0, (a, given dl/dW), in later blocks
    // (cp, cq); loaded one batch ahead.
    const auto edge_values = [&](int64_t e) {
      GradEdgeSlot<T> slot{0, T(0), T(0)};
      if (e < sg.k1) {
        slot.j = A.col[e];
        if (first) {
          slot.s0 = simt::ldg(A.a + e);
          slot.s1 = kFormed ? T(0) : simt::ldg(A.given + e);
        } else {
          slot.s0 = A.edge_scratch[2 * e];
          slot.s1 = A.edge_scratch[2 * e + 1];
        }
      }
      return slot;
    };
    for_each_edge_batch<G>(sg, lane, edge_values, [&](int64_t e, int count,
                                                      const GradEdgeSlot<T>& mine) {
      const bool edge_valid = e < sg.k1;
      const int32_t j_lane = mine.j;
      const T s0_lane = mine.s0, s1_lane = mine.s1;
      T cp_mine = T(0), cq_mine = T(0);
      for (int eb = 0; eb < count; eb += U) {
        const int valid = count - eb;
        int32_t j[U];
        T cp[U], cq[U];
        DIGNN_UNROLL
        for (int u = 0; u < U; ++u) j[u] = grp.bcast(j_lane, eb + u);
        if (!first) {
          DIGNN_UNROLL
          for (int u = 0; u < U; ++u) {
            cp[u] = grp.bcast(s0_lane, eb + u);
            cq[u] = grp.bcast(s1_lane, eb + u);
          }
        }
        // Every neighbour-row load of the batch before any math: p_j and q_j over this lane's
        // vectors of block cb and, in block 0 when dl/dW is formed, v_j and z_j.
        Pack<T, V> pj[U][kCudaVecsPerLane], qj[U][kCudaVecsPerLane];
        load_batch_block<T, V, G>(A.p, h, nvec_h, cb, lane, j, valid, pj);
        load_batch_block<T, V, G>(A.q, h, nvec_h, cb, lane, j, valid, qj);
        if (first) {  // make the edge scalars
          Pack<T, V> vj[U][kCudaVecsPerLane], zj[U][kCudaVecsPerLane];
          load_batch_block<T, V, G>(A.v, d, nvec_d, 0, lane, j, valid, vj);
          load_batch_block<T, V, G>(A.z, d, nvec_d, 0, lane, j, valid, zj);
          T s_pi[U], s_r2[U], s_g[U];
          DIGNN_UNROLL
          for (int u = 0; u < U; ++u) s_g[u] = T(0);
          if (kFormed) {  // dl/dW of the edges from v and z, first: v_j and z_j are then free
            // (the mode a compile-time constant in the loop over the vectors: no branch per
            // channel)
            const auto add_formed = [&](auto mode) {
              constexpr int kMode = decltype(mode)::value;
              for_each_lane_vector<T, V, G>(
                  lane, nvec_d, d, A.v, A.z, v_i, z_i, vi_blk, zi_blk, vj, zj, j, valid,
                  [&](int u, const Pack<T, V>& vi, const Pack<T, V>& zi,
                      const Pack<T, V>& vj_v, const Pack<T, V>& zj_v) {
                    DIGNN_UNROLL
                    for (int c = 0; c < V; ++c) {
                      T lhs, rhs;
                      if constexpr (kMode == kEdgeGradSymmetric) {  // (v_i - v_j).(z_j - z_i)
                        lhs = vi.v[c] - vj_v.v[c];
                        rhs = zj_v.v[c] - zi.v[c];
                      } else if constexpr (kMode == kEdgeGradOut) {  // v_i.(z_j - z_i)
                        lhs = vi.v[c];
                        rhs = zj_v.v[c] - zi.v[c];
                      } else {  // v_j.(z_i - z_j)
                        lhs = vj_v.v[c];
                        rhs = zi.v[c] - zj_v.v[c];
                      }
                      s_g[u] = simt::madd(lhs, rhs, s_g[u]);
                    }
                  });
            };
            if (A.mode == kEdgeGradSymmetric) {
              add_formed(std::integral_constant<int, kEdgeGradSymmetric>{});
            } else if (A.mode == kEdgeGradOut) {
              add_formed(std::integral_constant<int, kEdgeGradOut>{});
            } else {
              add_formed(std::integral_constant<int, kEdgeGradIn>{});
            }
          }
          edge_metrics<T, V, G>(grp, A.p, A.q, h, p_i, q_i, pi_blk, qi_blk, pj, qj, j, valid,
                                s_pi, s_r2);
          if (kFormed) {
            DIGNN_UNROLL
            for (int u = 0; u < U; ++u) s_g[u] = grp.sum(s_g[u]);
          }
          // lane eb + u makes the scalars of its edge u (s0_lane: a, s1_lane: the given
          // dl/dW), the group reads them back
          const int own = lane - eb;
          const T g = kFormed ? edge_value_of_lane(s_g, own) : s1_lane;
          const EdgeGradScalars<T> c =
              neural_edge_grad_scalars(s0_lane, g, edge_value_of_lane(s_pi, own),
                                       dignn_sqrt(edge_value_of_lane(s_r2, own)), A.eps);
          if (own >= 0 && own < U) {
            cp_mine = c.cp;
            cq_mine = c.cq;
          }
          DIGNN_UNROLL
          for (int u = 0; u < U; ++u) {
            const T bp = grp.bcast(c.cp, eb + u);
            const T bq = grp.bcast(c.cq, eb + u);
            cp[u] = u < valid ? bp : T(0);
            cq[u] = u < valid ? bq : T(0);
          }
        }
        DIGNN_UNROLL
        for (int u = 0; u < U; ++u) {
          cq_sum += cq[u];
          DIGNN_UNROLL
          for (int t = 0; t < kCudaVecsPerLane; ++t) {
            DIGNN_UNROLL
            for (int c = 0; c < V; ++c) {
              gp[t].v[c] = simt::madd(cp[u], pj[u][t].v[c], gp[t].v[c]);
              gq[t].v[c] = simt::madd(cq[u], qj[u][t].v[c], gq[t].v[c]);
            }
          }
        }
      }
      if (first && A.edge_scratch != nullptr && edge_valid) {
        A.edge_scratch[2 * e] = cp_mine;
        A.edge_scratch[2 * e + 1] = cq_mine;
      }
    });

    if (heavy_slot == nullptr) {
      DIGNN_UNROLL
      for (int t = 0; t < kCudaVecsPerLane; ++t) {
        const int64_t vh = cb + lane + t * G;
        if (vh < nvec_h) {
          const int64_t off = i * h + vh * V;
          const Pack<T, V> qi = load_ro<T, V>(A.q + off);
          const Pack<T, V> old_p = A.accumulate ? load_rw<T, V>(A.grad_p + off) : zero_pack<T, V>();
          const Pack<T, V> old_q = A.accumulate ? load_rw<T, V>(A.grad_q + off) : zero_pack<T, V>();
          Pack<T, V> out_p, out_q;
          DIGNN_UNROLL
          for (int c = 0; c < V; ++c) {
            out_p.v[c] = old_p.v[c] + gp[t].v[c];
            out_q.v[c] = (old_q.v[c] + cq_sum * qi.v[c]) - gq[t].v[c];
          }
          store<T, V>(A.grad_p + off, out_p);
          store<T, V>(A.grad_q + off, out_q);
        }
      }
    } else {
      DIGNN_UNROLL
      for (int t = 0; t < kCudaVecsPerLane; ++t) {
        const int64_t vh = cb + lane + t * G;
        if (vh < nvec_h) {
          store<T, V>(heavy_slot + vh * V, gp[t]);
          store<T, V>(heavy_slot + h + vh * V, gq[t]);
        }
      }
      if (first && lane == 0) heavy_slot[2 * h] = cq_sum;
    }
  }
}

// Finishes the heavy rows: one warp per row sums its segments' partials in segment order.
template <typename T, typename S>
DIGNN_KERNEL(kCudaBlockThreads)
    neural_weight_grad_combine_kernel(const NeuralWeightGradArgs<T, S> A) {
  constexpr int kGroups = kCudaBlockThreads / 32;
  const int lane = simt::thread_idx() & 31;
  const int64_t index = simt::block_idx() * kGroups + simt::thread_idx() / 32;
  if (index >= sched_total(A.sched, kScheduleHeavyRows)) return;
  const int64_t i = A.sched.heavy_row[index];
  const int64_t nseg = sched_upto(A.sched, i, kScheduleSegments) -
                       sched_before(A.sched, i, kScheduleSegments);
  const int64_t slot0 = sched_before(A.sched, i, kScheduleHeavySlots);
  const int64_t h = A.h;
  const int64_t pstride = grad_partial_stride(h);
  T cq_sum = T(0);
  for (int64_t s = 0; s < nseg; ++s) cq_sum += A.partial[(slot0 + s) * pstride + 2 * h];
  for (int64_t c = lane; c < h; c += 32) {
    T sp = T(0), sq = T(0);
    for (int64_t s = 0; s < nseg; ++s) {
      sp += A.partial[(slot0 + s) * pstride + c];
      sq += A.partial[(slot0 + s) * pstride + h + c];
    }
    const int64_t off = i * h + c;
    const T old_p = A.accumulate ? A.grad_p[off] : T(0);
    const T old_q = A.accumulate ? A.grad_q[off] : T(0);
    A.grad_p[off] = old_p + sp;
    A.grad_q[off] = (old_q + cq_sum * A.q[off]) - sq;
  }
}

// The segment kernel, then the heavy-row kernel. The kernels of a given dl/dW (no z, v) are
// compiled for S == T only.
template <typename T, typename S>
int launch_neural_weight_grad(const NeuralWeightGradArgs<T, S>& A, simt::Stream stream) {
  constexpr bool kGivenToo = std::is_same<S, T>::value;
  const bool formed = A.mode != kEdgeGradGiven;
  if (!formed && !kGivenToo) return 1;  // cudaErrorInvalidValue
  const int status = launch_with_shape<T>(A.plan, [&](auto vec, auto group) {
    constexpr int V = decltype(vec)::value, G = decltype(group)::value;
    const auto kernel = formed ? &neural_weight_grad_kernel<T, S, V, G, true>
                               : &neural_weight_grad_kernel<T, S, V, G, !kGivenToo>;
    return simt::launch(kernel, A.plan.main_blocks, kCudaBlockThreads, stream, A);
  });
  if (status != 0) return status;
  return simt::launch(&neural_weight_grad_combine_kernel<T, S>, A.plan.combine_blocks,
                      kCudaBlockThreads, stream, A);
}

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
