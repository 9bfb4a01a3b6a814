// Device helpers shared by the dignn kernels: channel vectors, lane groups, the schedule's
// accessors and the fixed-order block reduction of step norms. See launch.h for the design.
#pragma once

#include "cuda/launch.h"
#include "dignn/laplacian_math.h"

// A run-time loop that nvcc is not to unroll: the general path of rows wider than one channel
// block, whose unrolled copies would each hold their loads in registers on top of a batch's.
#if defined(__CUDACC__) && !defined(DIGNN_SIMT_EMULATION)
#define DIGNN_NO_UNROLL _Pragma("unroll 1")
#else
#define DIGNN_NO_UNROLL
#endif

namespace dignn {
namespace DIGNN_SIMT_NS {

template <typename X>
DIGNN_DEV X min_of(X a, X b) {
  return b < a ? b : a;
}

// V consecutive channels of a row, loaded and stored as one 16-byte access when V * sizeof(T)
// is 16 (rows are then 16-byte aligned: the host checks before choosing V = 4).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V>
DIGNN_DEV Pack<T, V> zero_pack() {
  Pack<T, V> p;
  DIGNN_UNROLL
  for (int c = 0; c < V; ++c) p.v[c] = T(0);
  return p;
}

// Plain load (data this kernel writes elsewhere, or wrote itself).
template <typename T, int V>
DIGNN_DEV Pack<T, V> load_rw(const T* ptr) {
#if defined(__CUDACC__)
  return *reinterpret_cast<const Pack<T, V>*>(ptr);
#else
  Pack<T, V> p;
  std::memcpy(p.v, ptr, sizeof(p.v));
  return p;
#endif
}

// Load of data that no thread writes during the kernel: the read-only data path on the GPU.
template <typename T, int V>
DIGNN_DEV Pack<T, V> load_ro(const T* ptr) {
#if defined(__CUDACC__)
  if constexpr (V == 4 && std::is_same<T, float>::value) {
    const float4 t = __ldg(reinterpret_cast<const float4*>(ptr));
    Pack<T, V> p;
    p.v[0] = t.x;
    p.v[1] = t.y;
    p.v[2] = t.z;
    p.v[3] = t.w;
    return p;
  } else if constexpr (V == 1 && std::is_arithmetic<T>::value) {
    Pack<T, V> p;
    p.v[0] = __ldg(ptr);
    return p;
  } else if constexpr (sizeof(Pack<T, V>) == 8) {  // four 16-bit values (rows 8-byte aligned)
    const uint2 t = __ldg(reinterpret_cast<const uint2*>(ptr));
    Pack<T, V> p;
    memcpy(&p, &t, sizeof(p));
    return p;
  }
#endif
  return load_rw<T, V>(ptr);
}

template <typename T, int V>
DIGNN_DEV void store(T* ptr, const Pack<T, V>& p) {
#if defined(__CUDACC__)
  *reinterpret_cast<Pack<T, V>*>(ptr) = p;
#else
  std::memcpy(ptr, p.v, sizeof(p.v));
#endif
}

// 16-bit storage (launch.h): V channels converted between the compute type T and the storage
// type S, each with c10's conversion (widening exact, narrowing to nearest even); S == T: p.
template <typename To, typename From, int V>
DIGNN_DEV Pack<To, V> converted(const Pack<From, V>& p) {
  if constexpr (std::is_same<To, From>::value) {
    return p;
  } else {
    Pack<To, V> r;
    DIGNN_UNROLL
    for (int c = 0; c < V; ++c) r.v[c] = static_cast<To>(p.v[c]);
    return r;
  }
}

// V channels stored as S, loaded read-only and widened to T.
template <typename T, int V, typename S>
DIGNN_DEV Pack<T, V> load_ro_as(const S* ptr) {
  return converted<T>(load_ro<S, V>(ptr));
}

// V channels of T stored as S.
template <typename T, int V, typename S>
DIGNN_DEV void store_as(S* ptr, const Pack<T, V>& p) {
  store<S, V>(ptr, converted<S>(p));
}

// p as store_as stores it, widened back (S == T: p itself).
template <typename S, typename T, int V>
DIGNN_DEV Pack<T, V> as_stored(const Pack<T, V>& p) {
  return converted<T>(converted<S>(p));
}

template <typename T, int V>
DIGNN_DEV T dot(const Pack<T, V>& a, const Pack<T, V>& b) {
  T s = a.v[0] * b.v[0];
  DIGNN_UNROLL
  for (int c = 1; c < V; ++c) s = simt::madd(a.v[c], b.v[c], s);
  return s;
}

template <typename T, int V>
DIGNN_DEV T dist_sq(const Pack<T, V>& a, const Pack<T, V>& b) {
  T t = a.v[0] - b.v[0];
  T s = t * t;
  DIGNN_UNROLL
  for (int c = 1; c < V; ++c) {
    t = a.v[c] - b.v[c];
    s = simt::madd(t, t, s);
  }
  return s;
}

// pi += p_i . p_j and r2 += ||q_i - q_j||^2 over one channel vector of each (the edge's
// pi_ij and rho_ij^2, eq. 13-14, summed vector by vector).
template <typename T, int V>
DIGNN_DEV void add_edge_metrics(const Pack<T, V>& p_i, const Pack<T, V>& p_j,
                                const Pack<T, V>& q_i, const Pack<T, V>& q_j, T& pi, T& r2) {
  pi += dot<T, V>(p_i, p_j);
  r2 += dist_sq<T, V>(q_i, q_j);
}

// G consecutive lanes of a warp working on one segment. All lanes of a group follow the same
// control flow, so the shuffles below name exactly the group's lanes in their mask.
template <int G>
struct Group {
  static_assert(G == 4 || G == 8 || G == 16 || G == 32, "group of 4, 8, 16 or 32 lanes");
  unsigned mask;
  int lane;  // 0 .. G-1
  DIGNN_DEV Group() {
    const int warp_lane = simt::thread_idx() & 31;
    lane = warp_lane & (G - 1);
    mask = G == 32 ? 0xffffffffu : ((1u << (G & 31)) - 1u) << (warp_lane & ~(G - 1));
  }
  // Value of `v` held by group lane `src` (0 <= src < G).
  template <typename X>
  DIGNN_DEV X bcast(X v, int src) const {
    return simt::shfl(mask, v, src, G);
  }
  // Sum over the group, identical in every lane (xor butterfly: a + b == b + a bitwise).
  template <typename X>
  DIGNN_DEV X sum(X v) const {
    DIGNN_UNROLL
    for (int o = G / 2; o > 0; o >>= 1) v += simt::shfl_xor(mask, v, o, G);
    return v;
  }
};

// Schedule accessors (column c: kScheduleSegments, kScheduleHeavySlots, kScheduleHeavyRows).
DIGNN_DEV int64_t sched_total(const ScheduleView& s, int c) {
  return s.n > 0 ? s.incl[c * s.n + s.n - 1] : 0;
}
DIGNN_DEV int64_t sched_before(const ScheduleView& s, int64_t row, int c) {
  return row > 0 ? s.incl[c * s.n + row - 1] : 0;
}
DIGNN_DEV int64_t sched_upto(const ScheduleView& s, int64_t row, int c) {
  return s.incl[c * s.n + row];
}

// The segment a group works on, resolved to its row and edge range.
struct Segment {
  int64_t row;
  int64_t k0, k1;  // edges [k0, k1) of the row
  int64_t index;   // segment index within the row
  int64_t nseg;    // segments of the row (more than one: a heavy row)
  int64_t slot;    // heavy rows: partial-sum slot of this segment
};

DIGNN_DEV Segment resolve_segment(const ScheduleView& s, const int64_t* rowptr,
                                  int64_t segment) {
  Segment sg;
  sg.row = s.segment_row[segment];
  const int64_t first = sched_before(s, sg.row, kScheduleSegments);
  sg.nseg = sched_upto(s, sg.row, kScheduleSegments) - first;
  sg.index = segment - first;
  sg.k0 = rowptr[sg.row] + sg.index * kSegmentEdges;
  sg.k1 = min_of<int64_t>(sg.k0 + kSegmentEdges, rowptr[sg.row + 1]);
  sg.slot = sched_before(s, sg.row, kScheduleHeavySlots) + sg.index;
  return sg;
}

// The group walks a segment's edges G at a time: lane l holds edge kb + l, whose values
// load(e) reads one batch ahead (an empty slot for e >= sg.k1). For each batch,
// body(e, count, slot): this lane's edge e = kb + lane and its slot; count, the real edges of
// the batch.
template <int G, typename Load, typename Body>
DIGNN_DEV void for_each_edge_batch(const Segment& sg, int lane, const Load& load,
                                   const Body& body) {
  auto cur = load(sg.k0 + lane);
  for (int64_t kb = sg.k0; kb < sg.k1; kb += G) {
    const int64_t e = kb + lane;
    const auto next = load(e + G);
    body(e, static_cast<int>(min_of<int64_t>(G, sg.k1 - kb)), cur);
    cur = next;
  }
}

// This lane's channel vectors of channel block cb of one row (rows of `nvec` vectors, stored as
// S): vectors cb + lane + t G, t < kCudaVecsPerLane; zero beyond the row or when !ok.
template <typename T, int V, int G, typename S>
DIGNN_DEV void load_lane_block(const S* row, int64_t nvec, int64_t cb, int lane, bool ok,
                               Pack<T, V> (&out)[kCudaVecsPerLane]) {
  const S* at = row + (cb + lane) * V;  // vector t at a constant offset from it
  DIGNN_UNROLL
  for (int t = 0; t < kCudaVecsPerLane; ++t) {
    const bool in_row = cb + lane + t * G < nvec;
    out[t] = ok && in_row ? load_ro_as<T, V>(at + t * G * V) : zero_pack<T, V>();
  }
}

// The same vectors of rows j[u] of x (rows of `width` channels, `nvec` vectors) for the U edges
// of a batch (zero for the edges u >= valid). Independent loads: a caller that makes every
// load of a batch before its math has them all in flight at once.
template <typename T, int V, int G, int U, typename S>
DIGNN_DEV void load_batch_block(const S* x, int64_t width, int64_t nvec, int64_t cb, int lane,
                                const int32_t (&j)[U], int valid,
                                Pack<T, V> (&out)[U][kCudaVecsPerLane]) {
  DIGNN_UNROLL
  for (int u = 0; u < U; ++u) {
    load_lane_block<T, V, G>(x + static_cast<int64_t>(j[u]) * width, nvec, cb, lane, u < valid,
                             out[u]);
  }
}

// For this lane's channel vectors vi = lane, lane + G, ... < nvec of two node signals x and y
// (rows of `width` channels; x_row and y_row: the rows of the segment's node), in vector
// order, and each edge u of a batch, with j = j[u]: f(u, x_i, y_i, x_j, y_j), each the vector
// vi of that row. The vectors of channel block 0 come from registers: xi, yi (row i's,
// load_lane_block) and xj, yj (the batch's, load_batch_block). Only a row wider than one block
// loads the rest here, each vector's loads before its math; only a group of a whole warp has
// such rows (group_size, launch.h), so smaller groups are compiled without that loop and the
// registers it holds. f is also called for the edges u >= valid, with zero vectors j: their
// results are to be ignored. x and y are stored as S.
template <typename T, int V, int G, int U, typename S, typename F>
DIGNN_DEV void for_each_lane_vector(int lane, int64_t nvec, int64_t width, const S* x,
                                    const S* y, const S* x_row, const S* y_row,
                                    const Pack<T, V> (&xi)[kCudaVecsPerLane],
                                    const Pack<T, V> (&yi)[kCudaVecsPerLane],
                                    const Pack<T, V> (&xj)[U][kCudaVecsPerLane],
                                    const Pack<T, V> (&yj)[U][kCudaVecsPerLane],
                                    const int32_t (&j)[U], int valid, const F& f) {
  DIGNN_UNROLL
  for (int t = 0; t < kCudaVecsPerLane; ++t) {
    if (lane + t * G < nvec) {
      DIGNN_UNROLL
      for (int u = 0; u < U; ++u) f(u, xi[t], yi[t], xj[u][t], yj[u][t]);
    }
  }
  if constexpr (G == kCudaWarpLanes) {
    DIGNN_NO_UNROLL
    for (int64_t vi = lane + kCudaVecsPerLane * G; vi < nvec; vi += G) {
      const Pack<T, V> xv = load_ro_as<T, V>(x_row + vi * V);
      const Pack<T, V> yv = load_ro_as<T, V>(y_row + vi * V);
      Pack<T, V> xj_v[U], yj_v[U];
      DIGNN_UNROLL
      for (int u = 0; u < U; ++u) {
        const int64_t off = static_cast<int64_t>(j[u]) * width + vi * V;
        xj_v[u] = u < valid ? load_ro_as<T, V>(x + off) : zero_pack<T, V>();
        yj_v[u] = u < valid ? load_ro_as<T, V>(y + off) : zero_pack<T, V>();
      }
      DIGNN_UNROLL
      for (int u = 0; u < U; ++u) f(u, xv, yv, xj_v[u], yj_v[u]);
    }
  }
}

// pi_u = p_i . p_{j_u} and r2_u = ||q_i - q_{j_u}||^2 (eq. 13-14) for the U edges of a batch:
// each lane sums its channel vectors in order (for_each_lane_vector; pi_blk, qi_blk, pj, qj:
// the registers of channel block 0), then the group sums the lanes. Identical in every lane;
// meaningless for the edges u >= valid.
template <typename T, int V, int G, int U>
DIGNN_DEV void edge_metrics(const Group<G>& grp, const T* p, const T* q, int64_t h,
                            const T* p_row, const T* q_row,
                            const Pack<T, V> (&pi_blk)[kCudaVecsPerLane],
                            const Pack<T, V> (&qi_blk)[kCudaVecsPerLane],
                            const Pack<T, V> (&pj)[U][kCudaVecsPerLane],
                            const Pack<T, V> (&qj)[U][kCudaVecsPerLane], const int32_t (&j)[U],
                            int valid, T (&pi)[U], T (&r2)[U]) {
  DIGNN_UNROLL
  for (int u = 0; u < U; ++u) pi[u] = r2[u] = T(0);
  for_each_lane_vector<T, V, G>(
      grp.lane, h / V, h, p, q, p_row, q_row, pi_blk, qi_blk, pj, qj, j, valid,
      [&](int u, const Pack<T, V>& pv, const Pack<T, V>& qv, const Pack<T, V>& pj_v,
          const Pack<T, V>& qj_v) { add_edge_metrics<T, V>(pv, pj_v, qv, qj_v, pi[u], r2[u]); });
  DIGNN_UNROLL
  for (int u = 0; u < U; ++u) {
    pi[u] = grp.sum(pi[u]);
    r2[u] = grp.sum(r2[u]);
  }
}

// x[k] for 0 <= k < U, else x[0], by selects (no run-time indexing of a register array). With
// k = lane - eb, lane eb + u of a batch picks the value of edge u: the edge it holds, so that
// each lane makes the per-edge scalars of its own edge once instead of every lane making those
// of every edge, and the group reads them back with U shuffles.
template <typename T, int U>
DIGNN_DEV T edge_value_of_lane(const T (&x)[U], int k) {
  T v = x[0];
  DIGNN_UNROLL
  for (int u = 1; u < U; ++u) v = k == u ? x[u] : v;
  return v;
}

// Writes this block's two sums (per group values, in group order) to out[2 * block + {0, 1}].
// Every thread of the block must call it.
template <int kGroups>
DIGNN_DEV void store_block_norms(double diff_sq, double out_sq, int lane, int group_in_block,
                                 double* out) {
  DIGNN_SHARED double s_diff[kGroups];
  DIGNN_SHARED double s_out[kGroups];
  if (lane == 0) {
    s_diff[group_in_block] = diff_sq;
    s_out[group_in_block] = out_sq;
  }
  simt::sync_block();
  if (simt::thread_idx() == 0) {
    double a = 0.0, b = 0.0;
    for (int g = 0; g < kGroups; ++g) {
      a += s_diff[g];
      b += s_out[g];
    }
    out[2 * simt::block_idx()] = a;
    out[2 * simt::block_idx() + 1] = b;
  }
}

// Runs launch(vec, group), both std::integral_constant<int, ...>, with the plan's elements per
// channel vector (4 only for float32) and lanes per group as compile-time values; returns its
// launch status. (Host code of the launchers.)
template <typename T, typename Launch>
int launch_with_shape(const PassPlan& plan, Launch&& launch) {
  const auto with_group = [&](auto vec) {
    switch (plan.group) {
      case 4:
        return launch(vec, std::integral_constant<int, 4>{});
      case 8:
        return launch(vec, std::integral_constant<int, 8>{});
      case 16:
        return launch(vec, std::integral_constant<int, 16>{});
      default:
        return launch(vec, std::integral_constant<int, 32>{});
    }
  };
  if constexpr (std::is_same<T, float>::value) {
    if (plan.vec == 4) return with_group(std::integral_constant<int, 4>{});
  }
  return with_group(std::integral_constant<int, 1>{});
}

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
