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

template <typename T, int V, int G>
DIGNN_KERNEL(kCudaBlockThreads) grad_pass_kernel(const GradPassArgs<T> A) {
  constexpr int kGroups = kCudaBlockThreads / G;
  constexpr int64_t kBlockVecs = G * kCudaVecsPerLane;
  constexpr int U = kCudaGradUnroll;
  const Group<G> grp;
  const int lane = grp.lane;
  const int group_in_block = simt::thread_idx() / G;
  const int64_t segment = simt::block_idx() * kGroups + group_in_block;
  // (no block-wide barrier in this kernel)
  if (segment >= sched_total(A.sched, kScheduleSegments)) return;

  const Segment sg = resolve_segment(A.sched, A.rowptr, segment);
  const int64_t i = sg.row;
  const bool heavy = sg.nseg > 1;
  const int64_t h = A.h;
  const int64_t nvec_h = h / V;
  const int64_t d = A.d;
  const bool formed = A.mode != kEdgeGradGiven;
  const int64_t nvec_d = formed ? d / V : 0;
  const T* p_i = A.p + i * h;
  const T* q_i = A.q + i * h;
  const T* v_i = formed ? A.v + i * d : nullptr;
  const T* z_i = formed ? A.z + i * d : nullptr;
  const int64_t pstride = grad_partial_stride(h);

  for (int64_t cb = 0; cb == 0 || cb < nvec_h; cb += kBlockVecs) {
    // The edge scalars (cp, cq) are made in channel block 0; later blocks (h wider than a
    // block) read them back from edge_scratch, each lane the edges it wrote itself.
    const bool first = cb == 0;
    Pack<T, V> gp[kCudaVecsPerLane], gq[kCudaVecsPerLane];
    Pack<T, V> pi_blk[kCudaVecsPerLane], qi_blk[kCudaVecsPerLane];  // row i's vectors of block 0
    DIGNN_UNROLL
    for (int t = 0; t < kCudaVecsPerLane; ++t) {
      gp[t] = gq[t] = zero_pack<T, V>();
      const int64_t vh = lane + t * G;
      const bool ok = first && vh < nvec_h;
      pi_blk[t] = ok ? load_ro<T, V>(p_i + vh * V) : zero_pack<T, V>();
      qi_blk[t] = ok ? load_ro<T, V>(q_i + vh * V) : zero_pack<T, V>();
    }
    T cq_sum = T(0);

    // Lane l holds edge kb + l: its column and, in block 0, (a, given dl/dW), in later blocks
    // (cp, cq); loaded one batch ahead.
    const auto edge_values = [&](int64_t e) {
      GradEdgeSlot<T> slot{0, T(0), T(0)};
      if (e < sg.k1) {
        slot.j = A.col[e];
        if (first) {
          slot.s0 = simt::ldg(A.a + e);
          slot.s1 = formed ? T(0) : simt::ldg(A.given + e);
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
        Pack<T, V> pj[U][kCudaVecsPerLane], qj[U][kCudaVecsPerLane];
        DIGNN_UNROLL
        for (int u = 0; u < U; ++u) {
          j[u] = grp.bcast(j_lane, eb + u);
          cp[u] = grp.bcast(s0_lane, eb + u);
          cq[u] = grp.bcast(s1_lane, eb + u);
        }
        DIGNN_UNROLL
        for (int u = 0; u < U; ++u) {
          const T* p_j = A.p + static_cast<int64_t>(j[u]) * h;
          const T* q_j = A.q + static_cast<int64_t>(j[u]) * h;
          DIGNN_UNROLL
          for (int t = 0; t < kCudaVecsPerLane; ++t) {
            const int64_t vh = cb + lane + t * G;
            const bool ok = u < valid && vh < nvec_h;
            pj[u][t] = ok ? load_ro<T, V>(p_j + vh * V) : zero_pack<T, V>();
            qj[u][t] = ok ? load_ro<T, V>(q_j + vh * V) : zero_pack<T, V>();
          }
        }
        if (first) {  // cp[u] holds a, cq[u] the given dl/dW: make the edge scalars
          T s_pi[U], s_r2[U], s_g[U];
          DIGNN_UNROLL
          for (int u = 0; u < U; ++u) {
            s_pi[u] = s_r2[u] = s_g[u] = T(0);
            DIGNN_UNROLL
            for (int t = 0; t < kCudaVecsPerLane; ++t) {  // vectors lane + t G, in order
              add_edge_metrics<T, V>(pi_blk[t], pj[u][t], qi_blk[t], qj[u][t], s_pi[u], s_r2[u]);
            }
          }
          // wide h: the vectors beyond block 0
          for_each_neighbour_vector<T, V, G>(
              lane + kCudaVecsPerLane * G, nvec_h, h, A.p, A.q, p_i, q_i, j, valid,
              [&](int u, const Pack<T, V>& pv, const Pack<T, V>& qv, const Pack<T, V>& pj_v,
                  const Pack<T, V>& qj_v) {
                add_edge_metrics<T, V>(pv, pj_v, qv, qj_v, s_pi[u], s_r2[u]);
              });
          if (formed) {  // dl/dW of the edge from v and z
            for_each_neighbour_vector<T, V, G>(
                lane, nvec_d, d, A.v, A.z, v_i, z_i, j, valid,
                [&](int u, const Pack<T, V>& vi, const Pack<T, V>& zi, const Pack<T, V>& vj,
                    const Pack<T, V>& zj) {
                  DIGNN_UNROLL
                  for (int c = 0; c < V; ++c) {
                    T lhs, rhs;
                    if (A.mode == kEdgeGradSymmetric) {  // (v_i - v_j).(z_j - z_i)
                      lhs = vi.v[c] - vj.v[c];
                      rhs = zj.v[c] - zi.v[c];
                    } else if (A.mode == kEdgeGradOut) {  // v_i.(z_j - z_i)
                      lhs = vi.v[c];
                      rhs = zj.v[c] - zi.v[c];
                    } else {  // v_j.(z_i - z_j)
                      lhs = vj.v[c];
                      rhs = zi.v[c] - zj.v[c];
                    }
                    s_g[u] = simt::madd(lhs, rhs, s_g[u]);
                  }
                });
          }
          DIGNN_UNROLL
          for (int u = 0; u < U; ++u) {
            s_pi[u] = grp.sum(s_pi[u]);
            s_r2[u] = grp.sum(s_r2[u]);
            if (formed) s_g[u] = grp.sum(s_g[u]);
          }
          DIGNN_UNROLL
          for (int u = 0; u < U; ++u) {
            T new_cp = T(0), new_cq = T(0);
            if (u < valid) {
              const T g = formed ? s_g[u] : cq[u];
              const EdgeGradScalars<T> c =
                  neural_edge_grad_scalars(cp[u], g, s_pi[u], dignn_sqrt(s_r2[u]), A.eps);
              new_cp = c.cp;
              new_cq = c.cq;
            }
            cp[u] = new_cp;
            cq[u] = new_cq;
            if (lane == eb + u) {
              cp_mine = new_cp;
              cq_mine = new_cq;
            }
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

    if (!heavy) {
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
      T* slot = A.partial + sg.slot * pstride;
      DIGNN_UNROLL
      for (int t = 0; t < kCudaVecsPerLane; ++t) {
        const int64_t vh = cb + lane + t * G;
        if (vh < nvec_h) {
          store<T, V>(slot + vh * V, gp[t]);
          store<T, V>(slot + h + vh * V, gq[t]);
        }
      }
      if (first && lane == 0) slot[2 * h] = cq_sum;
    }
  }
}

// Finishes the heavy rows: one warp per row sums its segments' partials in segment order.
template <typename T>
DIGNN_KERNEL(kCudaBlockThreads) grad_combine_kernel(const GradPassArgs<T> A) {
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

// The segment kernel, then the heavy-row kernel.
template <typename T>
int launch_grad_pass(const GradPassArgs<T>& A, simt::Stream stream) {
  const int status = launch_with_shape<T>(A.plan, [&](auto vec, auto group) {
    const auto kernel = &grad_pass_kernel<T, decltype(vec)::value, decltype(group)::value>;
    return simt::launch(kernel, A.plan.main_blocks, kCudaBlockThreads, stream, A);
  });
  if (status != 0) return status;
  return simt::launch(&grad_combine_kernel<T>, A.plan.combine_blocks, kCudaBlockThreads, stream,
                      A);
}

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
