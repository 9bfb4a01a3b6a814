// The dignn ops on the GPU (schemas in csrc/ops/schemas.cpp): argument checks, buffers and the
// solve loops, written once for the CUDA build (ops_cuda.cpp) and for the host emulator of the
// kernels (DIGNN_SIMT_EMULATION, tests only). Same semantics, checks and outputs as the CPU
// versions in csrc/cpu/ops_cpu.cpp; the kernels are in csrc/cuda/*_impl.cuh.
//
// Nothing here reads a device value on the host: the solve loops launch max_iter - 1 steps,
// the residual norms are reduced on the device in a fixed order, a device flag marks
// convergence (later steps then only carry the result forward) and the stats tensor is
// written on the device. So the solves never synchronize with the host, and they can be
// captured in a CUDA graph and replayed.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/util/Optional.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <tuple>
#include <utility>

#include "cuda/launch.h"
#include "dignn/laplacian_math.h"
#include "ops/checks.h"

#if !defined(DIGNN_SIMT_EMULATION)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dignn {
namespace DIGNN_SIMT_NS {

using at::Tensor;

#if defined(DIGNN_SIMT_EMULATION)
class DeviceScope {
 public:
  explicit DeviceScope(const Tensor&) {}
  simt::Stream stream() const { return 0; }
};
inline void check_status(int status, const char* what) {
  TORCH_CHECK(status == 0, "emulated kernel ", what, " failed with status ", status);
}
#else
class DeviceScope {
 public:
  explicit DeviceScope(const Tensor& t) : guard_(t.device()) {}
  simt::Stream stream() const { return c10::cuda::getCurrentCUDAStream().stream(); }

 private:
  c10::cuda::CUDAGuard guard_;
};
inline void check_status(int status, const char* what) {
  TORCH_CHECK(status == 0, "dignn CUDA kernel ", what, " failed to launch: ",
              cudaGetErrorString(static_cast<cudaError_t>(status)));
}
#endif

// The argument checks are those of csrc/ops/checks.h, shared with the CPU ops.

// The kernels index nodes with int32 (as CSRGraph stores them): int64 columns are converted.
inline Tensor index32(const Tensor& col, int64_t n) {
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(),
              "the GPU kernels support graphs of up to 2^31 - 1 nodes, got ", n);
  return col.scalar_type() == at::kInt ? col.contiguous() : col.to(at::kInt).contiguous();
}

// ----------------------------------------------------------------------- buffers --

template <typename T>
const T* cptr(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}
template <typename T>
T* mptr(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// 4 (16-byte channel vectors) for float32 when every width is a multiple of 4 and every row
// pointer is 16-byte aligned; else 1.
template <typename T>
int vector_width(std::initializer_list<int64_t> widths, std::initializer_list<const Tensor*> rows) {
  if (!std::is_same<T, float>::value) return 1;
  for (int64_t w : widths) {
    if (w % 4 != 0) return 1;
  }
  for (const Tensor* t : rows) {
    if (t != nullptr && t->defined() &&
        reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0) {
      return 1;
    }
  }
  return 4;
}

// The segments of one CSR (launch.h), built on the device from rowptr.
struct Schedule {
  Tensor incl, segment_row, heavy_row;
  int64_t n = 0, m = 0;
  ScheduleView view() const {
    return {incl.data_ptr<int64_t>(), segment_row.data_ptr<int32_t>(),
            heavy_row.data_ptr<int32_t>(), n};
  }
};

inline Schedule build_schedule(const Tensor& rowptr, int64_t m, simt::Stream stream) {
  Schedule s;
  s.n = num_rows(rowptr);
  s.m = m;
  const auto i64 = rowptr.options().dtype(at::kLong);
  Tensor counts = at::empty({3, s.n}, i64);
  check_status(launch_schedule_counts(rowptr.data_ptr<int64_t>(), s.n,
                                      counts.data_ptr<int64_t>(), stream),
               "schedule_counts");
  // Three 1-D scans: ATen runs those as one device-wide (cub) scan each, where a scan along
  // dim 0 of an n x 3 tensor would be a serial loop over n per column.
  s.incl = at::empty({3, s.n}, i64);
  for (int64_t c = 0; c < 3; ++c) {
    Tensor dst = s.incl.select(0, c);
    at::cumsum_out(dst, counts.select(0, c), 0);
  }
  s.segment_row = at::empty({max_segments(s.n, m)}, i64.dtype(at::kInt));
  s.heavy_row = at::empty({max_heavy_rows(m)}, i64.dtype(at::kInt));
  check_status(launch_schedule_fill(s.incl.data_ptr<int64_t>(), s.n,
                                    s.segment_row.data_ptr<int32_t>(),
                                    s.heavy_row.data_ptr<int32_t>(), stream),
               "schedule_fill");
  return s;
}

// A row pass's launch plan and heavy-row buffers. `norms`: also the per-block step norms.
template <typename T>
struct RowPass {
  RowPassArgs<T> args;
  Tensor partial, partial_kappa, main_norms, combine_norms;

  RowPass(const Schedule& s, const Tensor& rowptr, const Tensor& col32, int64_t d, int64_t h,
          bool neural, bool norms, int vec, const at::TensorOptions& opts) {
    args.neural = neural;
    args.rowptr = rowptr.data_ptr<int64_t>();
    args.col = col32.data_ptr<int32_t>();
    args.n = s.n;
    args.m = s.m;
    args.sched = s.view();
    args.d = d;
    args.h = h;
    args.plan = plan_pass(s.n, s.m, std::max(d, neural ? h : int64_t(0)) / vec, vec);
    partial = at::empty({max_heavy_slots(s.m) * std::max<int64_t>(d, 1)}, opts);
    args.partial = partial.data_ptr<T>();
    if (neural) {
      partial_kappa = at::empty({max_heavy_slots(s.m)}, opts);
      args.partial_kappa = partial_kappa.data_ptr<T>();
    }
    if (norms) {
      const auto dopts = opts.dtype(at::kDouble);
      main_norms = at::empty({std::max<int64_t>(args.plan.main_blocks, 1), 2}, dopts);
      combine_norms = at::empty({std::max<int64_t>(args.plan.combine_blocks, 1), 2}, dopts);
      args.main_norms = main_norms.data_ptr<double>();
      args.combine_norms = combine_norms.data_ptr<double>();
    }
  }

  void run(simt::Stream stream) const {
    if (args.n == 0) return;
    check_status(launch_row_pass<T>(args, stream), "row_pass");
  }

  // stats/flag from this pass's norms (iteration `iteration` of a solve).
  void finalize(Tensor& stats, Tensor& flag, int64_t iteration, double tol,
                simt::Stream stream) const {
    check_status(launch_finalize_step(args.main_norms, args.n ? args.plan.main_blocks : 0,
                                      args.combine_norms, args.n ? args.plan.combine_blocks : 0,
                                      stats.data_ptr<double>(), flag.data_ptr<int32_t>(),
                                      iteration, tol, stream),
                 "finalize_step");
  }
};

// (cy, ca) per row (row_coefficients in laplacian_math.h).
template <typename T>
std::pair<Tensor, Tensor> coefficient_vectors(const Tensor& chi, const Tensor& kappa,
                                              double inv_mu, simt::Stream stream) {
  Tensor cy = at::empty_like(chi, at::MemoryFormat::Contiguous);
  Tensor ca = at::empty_like(chi, at::MemoryFormat::Contiguous);
  check_status(launch_row_coefficients<T>(chi.data_ptr<T>(), kappa.data_ptr<T>(),
                                          static_cast<T>(inv_mu), chi.numel(), cy.data_ptr<T>(),
                                          ca.data_ptr<T>(), stream),
               "row_coefficients");
  return {cy, ca};
}

inline std::pair<Tensor, Tensor> coefficients(const Tensor& chi, const Tensor& kappa,
                                              double inv_mu, simt::Stream stream) {
  std::pair<Tensor, Tensor> out;
  AT_DISPATCH_FLOATING_TYPES(chi.scalar_type(), "row_coefficients", [&] {
    out = coefficient_vectors<scalar_t>(chi, kappa, inv_mu, stream);
  });
  return out;
}

// Writes [1, ||x||, 1 (0 if x = 0)] and the flag: iteration 1 of a solve from zero gives x.
inline void first_iteration_stats(const Tensor& x, Tensor& stats, Tensor& flag, double tol,
                                  simt::Stream stream) {
  const int64_t blocks = sum_squares_blocks(x.numel());
  Tensor sums = at::empty({blocks, 2}, x.options().dtype(at::kDouble));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "sum_squares", [&] {
    check_status(launch_sum_squares<scalar_t>(cptr<scalar_t>(x), x.numel(),
                                              sums.data_ptr<double>(), stream),
                 "sum_squares");
  });
  check_status(launch_finalize_step(sums.data_ptr<double>(), blocks, nullptr, 0,
                                    stats.data_ptr<double>(), flag.data_ptr<int32_t>(), 1, tol,
                                    stream),
               "finalize_step");
}

// One gradient pass (grad_pass_impl.cuh) over a CSR.
template <typename T>
void gradient_pass(const Schedule& s, const Tensor& rowptr, const Tensor& col32,
                   const Tensor& a, const Tensor& p, const Tensor& q, double eps, int mode,
                   const Tensor& given, const Tensor& z, const Tensor& v, bool accumulate,
                   Tensor& grad_p, Tensor& grad_q, simt::Stream stream) {
  if (s.n == 0) return;
  GradPassArgs<T> A;
  A.rowptr = rowptr.data_ptr<int64_t>();
  A.col = col32.data_ptr<int32_t>();
  A.n = s.n;
  A.m = s.m;
  A.sched = s.view();
  A.a = cptr<T>(a);
  A.p = p.data_ptr<T>();
  A.q = q.data_ptr<T>();
  A.h = p.size(1);
  A.eps = static_cast<T>(eps);
  A.mode = mode;
  A.given = cptr<T>(given);
  const bool formed = mode != kEdgeGradGiven;
  A.z = formed ? z.data_ptr<T>() : nullptr;
  A.v = formed ? v.data_ptr<T>() : nullptr;
  A.d = formed ? z.size(1) : 0;
  A.accumulate = accumulate;
  A.grad_p = grad_p.data_ptr<T>();
  A.grad_q = grad_q.data_ptr<T>();
  const int vec = vector_width<T>({A.h, A.d}, {&p, &q, &z, &v, &grad_p, &grad_q});
  A.plan = plan_pass(s.n, s.m, std::max(A.h, A.d) / vec, vec);
  Tensor partial = at::empty({max_heavy_slots(s.m) * grad_partial_stride(A.h)}, p.options());
  A.partial = partial.data_ptr<T>();
  Tensor scratch;
  if (A.h / vec > A.plan.group * kCudaVecsPerLane) {  // h spans several channel blocks
    scratch = at::empty({2 * std::max<int64_t>(s.m, 1)}, p.options());
    A.edge_scratch = scratch.data_ptr<T>();
  }
  check_status(launch_grad_pass<T>(A, stream), "grad_pass");
}

// ------------------------------------------------------------------- building blocks --

inline std::tuple<Tensor, Tensor> neural_edge_weights_gpu(const Tensor& rowptr,
                                                          const Tensor& col, const Tensor& a,
                                                          const Tensor& p, const Tensor& q,
                                                          double eps) {
  const int64_t n = check_neural_edge_weights_args(rowptr, col, a, p, q, eps);
  DeviceScope scope(p);
  const auto stream = scope.stream();
  const int64_t m = col.numel();
  Tensor w = at::empty({m}, p.options());
  Tensor kappa = at::empty({n}, p.options());
  if (n == 0) return {w, kappa};
  const Tensor rp = rowptr.contiguous();
  const Tensor cl = index32(col, n);
  const Tensor ac = a.contiguous(), pc = p.contiguous(), qc = q.contiguous();
  const Schedule s = build_schedule(rp, m, stream);
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "neural_edge_weights", [&] {
    const int64_t h = p.size(1);
    const int vec = vector_width<scalar_t>({h}, {&pc, &qc});
    RowPass<scalar_t> pass(s, rp, cl, 0, h, true, false, vec, p.options());
    pass.args.a = ac.data_ptr<scalar_t>();
    pass.args.p = pc.data_ptr<scalar_t>();
    pass.args.q = qc.data_ptr<scalar_t>();
    pass.args.eps = static_cast<scalar_t>(eps);
    pass.args.w_out = w.data_ptr<scalar_t>();
    pass.args.kappa_out = kappa.data_ptr<scalar_t>();
    pass.run(stream);
  });
  return {w, kappa};
}

inline std::tuple<Tensor, Tensor> neural_edge_weights_backward_gpu(
    const Tensor& rowptr, const Tensor& col, const Tensor& a, const Tensor& p, const Tensor& q,
    double eps, const Tensor& grad_w, const Tensor& t_rowptr, const Tensor& t_col,
    const Tensor& t_perm) {
  const int64_t n = check_neural_edge_weights_backward_args(rowptr, col, a, p, q, eps, grad_w,
                                                            t_rowptr, t_col, t_perm);
  DeviceScope scope(p);
  const auto stream = scope.stream();
  Tensor grad_p = at::empty_like(p, at::MemoryFormat::Contiguous);
  Tensor grad_q = at::empty_like(q, at::MemoryFormat::Contiguous);
  if (n == 0) return {grad_p, grad_q};
  const int64_t m = col.numel();
  const Tensor rp = rowptr.contiguous(), t_rp = t_rowptr.contiguous();
  const Tensor cl = index32(col, n), t_cl = index32(t_col, n);
  const Tensor ac = a.contiguous(), gw = grad_w.contiguous();
  const Tensor perm = t_perm.contiguous();
  const Tensor t_a = ac.index_select(0, perm), t_gw = gw.index_select(0, perm);
  const Tensor pc = p.contiguous(), qc = q.contiguous();
  const Schedule s = build_schedule(rp, m, stream);
  const Schedule ts = build_schedule(t_rp, m, stream);
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "neural_edge_weights_backward", [&] {
    gradient_pass<scalar_t>(s, rp, cl, ac, pc, qc, eps, kEdgeGradGiven, gw, Tensor(), Tensor(),
                            false, grad_p, grad_q, stream);
    gradient_pass<scalar_t>(ts, t_rp, t_cl, t_a, pc, qc, eps, kEdgeGradGiven, t_gw, Tensor(),
                            Tensor(), true, grad_p, grad_q, stream);
  });
  return {grad_p, grad_q};
}

// out = b + cy y + rs (W y) (rs undefined: 1) over the CSR (rowptr, col32).
inline Tensor cached_pass(const Tensor& rowptr, const Tensor& col32, const Tensor& w,
                          const Tensor& b, const Tensor& cy, const Tensor& rs, const Tensor& y,
                          simt::Stream stream) {
  const int64_t n = num_rows(rowptr);
  Tensor out = at::empty_like(y, at::MemoryFormat::Contiguous);
  if (n == 0) return out;
  const Schedule s = build_schedule(rowptr, col32.numel(), stream);
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "cached_pass", [&] {
    const int64_t d = y.size(1);
    const int vec = vector_width<scalar_t>({d}, {&b, &y, &out});
    RowPass<scalar_t> pass(s, rowptr, col32, d, 0, false, false, vec, y.options());
    auto& A = pass.args;
    A.w = w.data_ptr<scalar_t>();
    A.b = b.data_ptr<scalar_t>();
    A.y = y.data_ptr<scalar_t>();
    A.out = out.data_ptr<scalar_t>();
    A.cy = cy.data_ptr<scalar_t>();
    A.rs = cptr<scalar_t>(rs);
    pass.run(stream);
  });
  return out;
}

inline Tensor diffusion_step_gpu(const Tensor& rowptr, const Tensor& col, const Tensor& w,
                                 const Tensor& chi, const Tensor& kappa, const Tensor& x,
                                 const Tensor& z, double mu) {
  const int64_t n = check_diffusion_step_args(rowptr, col, w, chi, kappa, x, z, mu);
  DeviceScope scope(x);
  const auto stream = scope.stream();
  Tensor cy, ca;
  std::tie(cy, ca) = coefficients(chi.contiguous(), kappa.contiguous(), 1.0 / mu, stream);
  return cached_pass(rowptr.contiguous(), index32(col, n), w.contiguous(), x.contiguous(), cy,
                     ca, z.contiguous(), stream);
}

inline Tensor csr_fma_gpu(const Tensor& rowptr, const Tensor& col, const Tensor& w,
                          const Tensor& y, const Tensor& b, const Tensor& cy, const Tensor& rs) {
  const int64_t n = check_csr_fma_args(rowptr, col, w, y, b, cy, rs);
  DeviceScope scope(y);
  return cached_pass(rowptr.contiguous(), index32(col, n), w.contiguous(), b.contiguous(),
                     cy.contiguous(), rs.contiguous(), y.contiguous(), scope.stream());
}

// The fused gradient pass over (rowptr, col) [symmetric] or (rowptr, col) then the transposed
// CSR [directed], with dl/dW formed from v and z.
inline void weight_grad_passes(const Tensor& rp, const Tensor& cl, const Schedule* s_in,
                               const Tensor& ac, const Tensor& pc, const Tensor& qc, double eps,
                               const Tensor& z, const Tensor& v, const Transposed& t,
                               const Schedule* ts_in, Tensor& grad_p, Tensor& grad_q,
                               simt::Stream stream) {
  const int64_t n = num_rows(rp), m = cl.numel();
  if (n == 0) return;
  const Schedule s = s_in != nullptr ? *s_in : build_schedule(rp, m, stream);
  AT_DISPATCH_FLOATING_TYPES(pc.scalar_type(), "neural_weight_grad", [&] {
    if (!t.defined()) {
      gradient_pass<scalar_t>(s, rp, cl, ac, pc, qc, eps, kEdgeGradSymmetric, Tensor(), z, v,
                              false, grad_p, grad_q, stream);
    } else {
      const Schedule ts = ts_in != nullptr ? *ts_in : build_schedule(t.rowptr, m, stream);
      const Tensor t_cl = index32(t.col, n);
      const Tensor t_a = ac.index_select(0, t.perm);
      gradient_pass<scalar_t>(s, rp, cl, ac, pc, qc, eps, kEdgeGradOut, Tensor(), z, v, false,
                              grad_p, grad_q, stream);
      gradient_pass<scalar_t>(ts, t.rowptr, t_cl, t_a, pc, qc, eps, kEdgeGradIn, Tensor(), z, v,
                              true, grad_p, grad_q, stream);
    }
  });
}

inline std::tuple<Tensor, Tensor> neural_weight_grad_gpu(
    const Tensor& rowptr, const Tensor& col, const Tensor& a, const Tensor& p, const Tensor& q,
    const Tensor& z, const Tensor& v, double eps, const OptTensor& t_rowptr,
    const OptTensor& t_col, const OptTensor& t_perm) {
  const Transposed t =
      check_neural_weight_grad_args(rowptr, col, a, p, q, z, v, t_rowptr, t_col, t_perm);
  const int64_t n = num_rows(rowptr);
  DeviceScope scope(z);
  Tensor grad_p = at::empty_like(p, at::MemoryFormat::Contiguous);
  Tensor grad_q = at::empty_like(q, at::MemoryFormat::Contiguous);
  weight_grad_passes(rowptr.contiguous(), index32(col, n), nullptr, a.contiguous(),
                     p.contiguous(), q.contiguous(), eps, z.contiguous(), v.contiguous(), t,
                     nullptr, grad_p, grad_q, scope.stream());
  return {grad_p, grad_q};
}

// ------------------------------------------------------------------ the solve loops --

inline std::tuple<Tensor, Tensor, Tensor, Tensor> implicit_diffusion_gpu(
    const Tensor& rowptr, const Tensor& col, const Tensor& edge_value, const Tensor& x_in,
    const Tensor& chi_in, const OptTensor& p_in, const OptTensor& q_in,
    const OptTensor& kappa_in, double mu, double eps, int64_t max_iter, double tol,
    const OptTensor& t_rowptr, const OptTensor& t_col, const OptTensor& t_perm) {
  const bool neural = check_implicit_diffusion_args(rowptr, col, edge_value, x_in, chi_in, p_in,
                                                    q_in, kappa_in, mu, eps, max_iter, tol,
                                                    t_rowptr, t_col, t_perm);
  const int64_t n = num_rows(rowptr);
  DeviceScope scope(x_in);
  const auto stream = scope.stream();
  const double inv_mu = 1.0 / mu;
  const int64_t m = col.numel();
  const Tensor x = x_in.contiguous();
  const Tensor chi = chi_in.contiguous();
  const Tensor rp = rowptr.contiguous();
  const Tensor cl = index32(col, n);
  const Tensor value = edge_value.contiguous();
  Tensor p, q;
  if (neural) {
    p = p_in->contiguous();
    q = q_in->contiguous();
  }
  Tensor stats = at::empty({3}, x.options().dtype(at::kDouble));
  Tensor flag = at::zeros({1}, x.options().dtype(at::kInt));

  // Iteration 1 from Z_0 = 0 gives Z_1 = X (eq. iter).
  Tensor z = x.clone();
  first_iteration_stats(x, stats, flag, tol, stream);

  Tensor w, kappa, cy, ca;
  if (!neural) {
    w = value.clone();
    if (kappa_in.has_value()) {
      kappa = kappa_in->contiguous().clone();
    } else {
      kappa = at::zeros({n}, x.options());
      if (n > 0) {
        AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "row_sums", [&] {
          check_status(launch_row_sums<scalar_t>(rp.data_ptr<int64_t>(),
                                                 value.data_ptr<scalar_t>(), n,
                                                 kappa.data_ptr<scalar_t>(), stream),
                       "row_sums");
        });
      }
    }
    std::tie(cy, ca) = coefficients(chi, kappa, inv_mu, stream);
  } else {
    w = at::empty({m}, x.options());
    kappa = at::empty({n}, x.options());
    cy = at::empty({n}, x.options());
    ca = at::empty({n}, x.options());
  }
  if (n == 0) return {z, w, kappa, stats};

  const Schedule s = build_schedule(rp, m, stream);
  Tensor z_next = at::empty_like(z);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "implicit_diffusion", [&] {
    using T = scalar_t;
    const int64_t d = x.size(1);
    const int64_t h = neural ? p.size(1) : 0;
    const int vec = vector_width<T>({d}, {&x, &z, &z_next});
    RowPass<T> step(s, rp, cl, d, 0, false, true, vec, x.options());
    step.args.w = w.data_ptr<T>();
    step.args.b = x.data_ptr<T>();
    step.args.cy = cy.data_ptr<T>();
    step.args.rs = ca.data_ptr<T>();
    step.args.converged = flag.data_ptr<int32_t>();
    // The neural pass of iteration 2 also makes W and kappa (and with max_iter = 1, only them).
    const bool fused_step = neural && max_iter >= 2;
    const int fused_vec = vector_width<T>({d, h}, {&x, &z, &z_next, &p, &q});
    RowPass<T> fused(s, rp, cl, fused_step ? d : 0, h, true, fused_step,
                     fused_step ? fused_vec : vector_width<T>({h}, {&p, &q}), x.options());
    if (neural) {
      auto& A = fused.args;
      A.a = value.data_ptr<T>();
      A.p = p.data_ptr<T>();
      A.q = q.data_ptr<T>();
      A.eps = static_cast<T>(eps);
      A.w_out = w.data_ptr<T>();
      A.kappa_out = kappa.data_ptr<T>();
      if (fused_step) {
        A.chi = chi.data_ptr<T>();
        A.inv_mu = static_cast<T>(inv_mu);
        A.b = x.data_ptr<T>();
        A.converged = flag.data_ptr<int32_t>();
      }
    }
    for (int64_t t = 2; t <= max_iter; ++t) {
      if (neural && t == 2) {
        fused.args.y = z.data_ptr<T>();
        fused.args.out = z_next.data_ptr<T>();
        fused.run(stream);
        fused.finalize(stats, flag, t, tol, stream);
        std::tie(cy, ca) = coefficient_vectors<T>(chi, kappa, inv_mu, stream);
        step.args.cy = cy.data_ptr<T>();
        step.args.rs = ca.data_ptr<T>();
      } else {
        step.args.y = z.data_ptr<T>();
        step.args.out = z_next.data_ptr<T>();
        step.run(stream);
        step.finalize(stats, flag, t, tol, stream);
      }
      std::swap(z, z_next);
    }
    if (neural && max_iter == 1) fused.run(stream);  // the backward still needs W and kappa
  });
  return {z, w, kappa, stats};
}

inline std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> implicit_diffusion_backward_gpu(
    const Tensor& rowptr, const Tensor& col, const Tensor& edge_value, const Tensor& w,
    const Tensor& kappa_in, const OptTensor& t_rowptr, const OptTensor& t_col,
    const OptTensor& t_perm, const Tensor& x_in, const Tensor& chi_in, const OptTensor& p_in,
    const OptTensor& q_in, const Tensor& z_in, const Tensor& grad_z, double mu, double eps,
    int64_t max_iter, double tol) {
  const Transposed t = check_implicit_diffusion_backward_args(
      rowptr, col, edge_value, w, kappa_in, t_rowptr, t_col, t_perm, x_in, chi_in, p_in, q_in,
      z_in, grad_z, mu, eps, max_iter);
  const bool neural = p_in.has_value() && q_in.has_value();
  const int64_t n = num_rows(rowptr);
  DeviceScope scope(x_in);
  const auto stream = scope.stream();
  const double inv_mu = 1.0 / mu;
  const int64_t m = col.numel();
  const Tensor x = x_in.contiguous();
  const Tensor z = z_in.contiguous();
  const Tensor g = grad_z.contiguous();
  const Tensor chi = chi_in.contiguous();
  const Tensor rp = rowptr.contiguous();
  Tensor cy, ca;  // (not a structured binding: the lambdas below capture them, C++17)
  std::tie(cy, ca) = coefficients(chi, kappa_in.contiguous(), inv_mu, stream);

  // Adjoint u = g + cy.u + W^T (ca.u), u_0 = 0 so u_1 = g; rows of W^T are the transposed
  // CSR, or the CSR itself on a symmetric graph.
  const Tensor wc = w.contiguous();
  const Tensor t_rp = t.defined() ? t.rowptr : rp;
  const Tensor t_cl = t.defined() ? t.col : col.contiguous();
  const Tensor t_w = (t.defined() ? wc.index_select(0, t.perm) : wc) * ca.index_select(0, t_cl);
  Tensor u = g.clone();
  Tensor stats = at::empty({3}, x.options().dtype(at::kDouble));
  Tensor flag = at::zeros({1}, x.options().dtype(at::kInt));
  first_iteration_stats(g, stats, flag, tol, stream);
  Schedule ts;
  if (n > 0) {
    ts = build_schedule(t_rp, m, stream);
    const Tensor t_cl32 = index32(t_cl, n);
    Tensor u_next = at::empty_like(u);
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "implicit_diffusion_backward", [&] {
      using T = scalar_t;
      const int64_t d = x.size(1);
      const int vec = vector_width<T>({d}, {&g, &u, &u_next});
      RowPass<T> step(ts, t_rp, t_cl32, d, 0, false, true, vec, x.options());
      step.args.w = t_w.data_ptr<T>();
      step.args.b = g.data_ptr<T>();
      step.args.cy = cy.data_ptr<T>();
      step.args.converged = flag.data_ptr<int32_t>();
      for (int64_t it = 2; it <= max_iter; ++it) {
        step.args.y = u.data_ptr<T>();
        step.args.out = u_next.data_ptr<T>();
        step.run(stream);
        step.finalize(stats, flag, it, tol, stream);
        std::swap(u, u_next);
      }
    });
  }

  // dl/dx = u; dl/dchi_i = u_i . (x_i - z_i) / chi_i (0 on guarded rows, where ca = 0).
  Tensor grad_chi = (u * (x - z)).sum(1) * ca * mu;
  Tensor grad_p, grad_q;
  if (neural) {
    Tensor v = u * ca.unsqueeze(1);
    grad_p = at::empty_like(*p_in, at::MemoryFormat::Contiguous);
    grad_q = at::empty_like(*q_in, at::MemoryFormat::Contiguous);
    if (n > 0) {
      // On a symmetric graph the adjoint's schedule is the CSR's own.
      weight_grad_passes(rp, index32(col, n), t.defined() ? nullptr : &ts,
                         edge_value.contiguous(), p_in->contiguous(), q_in->contiguous(), eps,
                         z, v, t, t.defined() ? &ts : nullptr, grad_p, grad_q, stream);
    }
  } else {
    grad_p = at::empty({0}, x.options());
    grad_q = at::empty({0}, x.options());
  }
  return {u, grad_chi, grad_p, grad_q, stats};
}

// -------------------------------------------------------------------- graph check --
// The conditions of check_graph_data (ops/checks.h) as device ops, folded into one flag that
// is read back once; when it is set, the host version runs on copies to name the first bad
// entry, so the messages are the CPU op's.

// rowptr[0] != 0, a decreasing step, rowptr[-1] != m, or a col entry outside 0..n-1.
inline Tensor csr_data_bad(const Tensor& rowptr, const Tensor& col) {
  const int64_t n = num_rows(rowptr), m = col.numel();
  Tensor bad = rowptr.select(0, 0).ne(0).logical_or_(rowptr.select(0, n).ne(m));
  if (n > 0) bad.logical_or_(at::diff(rowptr).min().lt(0));
  if (m > 0) {
    const auto range = at::aminmax(col);
    bad.logical_or_(std::get<0>(range).lt(0)).logical_or_(std::get<1>(range).ge(n));
  }
  return bad;
}

// perm is not a permutation of 0..m-1: an entry out of range, or a position no entry hits
// (m entries in range that hit all m positions hit each once).
inline Tensor permutation_bad(const Tensor& perm) {
  const int64_t m = perm.numel();
  if (m == 0) return at::zeros({}, perm.options().dtype(at::kBool));
  const auto range = at::aminmax(perm);
  Tensor bad = std::get<0>(range).lt(0).logical_or_(std::get<1>(range).ge(m));
  Tensor hit = at::zeros({m}, perm.options().dtype(at::kBool));
  hit.index_fill_(0, perm.clamp(0, m - 1).to(at::kLong), true);
  return bad.logical_or_(hit.logical_not().any());
}

inline void check_graph_gpu(const Tensor& rowptr, const Tensor& col, int64_t num_nodes,
                            const OptTensor& t_rowptr, const OptTensor& t_col,
                            const OptTensor& t_perm) {
  const Transposed t = check_graph_args(rowptr, col, num_nodes, t_rowptr, t_col, t_perm);
  DeviceScope scope(rowptr);
  Tensor bad = csr_data_bad(rowptr, col);
  if (t.defined()) {
    bad.logical_or_(csr_data_bad(t.rowptr, t.col)).logical_or_(permutation_bad(t.perm));
  }
  if (!bad.item<bool>()) return;  // the one read (a sync)
  const auto host = [](const Tensor& x) { return x.defined() ? x.cpu() : x; };
  check_graph_data(host(rowptr), host(col), Transposed{host(t.rowptr), host(t.col), host(t.perm)});
  TORCH_CHECK(false, "check_graph: the device found a bad entry in the graph that the host "
              "check did not (please report this)");
}

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
