// The GPU's Passes (the interface in csrc/ops/passes.h), for the CUDA build (ops_cuda.cpp) and
// for the kernels' host emulator (DIGNN_SIMT_EMULATION, tests only); the kernels are in
// csrc/cuda/*_impl.cuh.
//
// Nothing here reads a device value on the host: a solve launches max_iter - 1 steps, the
// residual norms are reduced on the device in a fixed order, a device flag marks convergence
// (later steps then only carry the result forward) and the stats tensor is written on the
// device. So the solves never synchronize with the host, and they can be captured in a CUDA
// graph and replayed.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/device_csr.h"
#include "cuda/device_graph_check.h"
#include "cuda/device_row_pass.h"
#include "cuda/device_scope.h"
#include "cuda/launch.h"
#include "ops/checks.h"
#include "ops/passes.h"

namespace dignn {
namespace DIGNN_SIMT_NS {

// The stats [iterations, ||Y_t - Y_{t-1}||, relative] and the converged flag of a solve, both
// on the device, written by the finalize kernel after every step.
class DeviceResidual {
 public:
  // Iteration 1 from Y_0 = 0 gives Y_1 = B: [1, ||b||, 1 (0 if b = 0)], converged if b = 0.
  // b in the compute dtype, or (a 16-bit solve's Y_1 as stored) in 16 bits, widened to float32
  // element by element.
  DeviceResidual(const at::Tensor& b, double tol, simt::Stream stream)
      : stats_(at::empty({3}, b.options().dtype(at::kDouble))),
        flag_(at::zeros({1}, b.options().dtype(at::kInt))),
        tol_(tol),
        stream_(stream) {
    const int64_t blocks = sum_squares_blocks(b.numel());
    at::Tensor sums = at::empty({blocks, 2}, b.options().dtype(at::kDouble));
    const at::ScalarType stored = b.scalar_type();
    ops::dispatch_stored(is_storage16(b) ? at::kFloat : stored, stored, "sum_squares",
                         [&](auto compute_tag, auto storage_tag) {
                           using T = decltype(compute_tag);
                           using S = decltype(storage_tag);
                           check_status(launch_sum_squares<T, S>(data_or_null<S>(b), b.numel(),
                                                                 sums.data_ptr<double>(), stream),
                                        "sum_squares");
                         });
    check_status(launch_finalize_step(sums.data_ptr<double>(), blocks, nullptr, 0,
                                      stats_.data_ptr<double>(), flag_.data_ptr<int32_t>(), 1,
                                      tol, false, stream),
                 "finalize_step");
  }

  bool stopped() const { return false; }  // never read on the host
  at::Tensor stats() const { return stats_; }
  const int32_t* converged() const { return flag_.data_ptr<int32_t>(); }
  // last: the wide last iteration of a 16-bit solve, recorded even once the solve stopped
  // (then as the iteration after the one it stopped at; launch_finalize_step).
  void record(const RowPass& pass, int64_t iteration, bool last = false) const {
    pass.finalize(stats_, flag_, iteration, tol_, last, stream_);
  }

 private:
  at::Tensor stats_, flag_;
  double tol_;
  simt::Stream stream_;
};

// The row pass of a solve.
class DeviceRowStep {
 public:
  // last: DevicePasses::last_step (the pass then has no converged flag).
  DeviceRowStep(RowPass pass, const DeviceResidual& residual, simt::Stream stream,
                bool last = false)
      : pass_(std::move(pass)), residual_(&residual), stream_(stream), last_(last) {}
  void run(const Iterates& y, int64_t iteration) const {
    pass_.run(y.current, y.next, stream_);
    residual_->record(pass_, iteration, last_);
  }

 private:
  RowPass pass_;
  const DeviceResidual* residual_;
  simt::Stream stream_;
  bool last_;
};

class DevicePasses {
 public:
  using Csr = DeviceCsr;
  using Residual = DeviceResidual;
  using RowStep = DeviceRowStep;

  explicit DevicePasses(const at::Tensor& like) : scope_(like) {}

  static constexpr bool kAndersonRecord = false;  // the GPU solves take the Triton record

  Csr csr(const at::Tensor& rowptr, const at::Tensor& col) const {
    return make_device_csr(rowptr, col, stream());
  }
  // The schedule of a CSR as tensors (the op csr_schedule), and the CSR made with one.
  static std::vector<at::Tensor> schedule_of(const Csr& csr) {
    return {csr.incl, csr.segment_row, csr.heavy_row};
  }
  // (no rows: no tensors)
  static void check_schedule(at::TensorList s, const at::Tensor& rowptr, int64_t m) {
    const int64_t n = num_rows(rowptr);
    const auto is = [&](const at::Tensor& t, at::ScalarType dtype, at::IntArrayRef shape) {
      return t.scalar_type() == dtype && t.sizes() == shape && t.device() == rowptr.device() &&
             t.is_contiguous();
    };
    TORCH_CHECK(n == 0 ? s.empty()
                       : s.size() == 3 && is(s[0], at::kLong, {3, n}) &&
                             is(s[1], at::kInt, {max_segments(n, m)}) &&
                             is(s[2], at::kInt, {max_heavy_rows(m)}),
                "schedule must be csr_schedule(rowptr, col) of this graph (", n == 0 ? 0 : 3,
                " tensors on ", rowptr.device(), " for ", n, " rows and ", m, " edges), got ",
                s.size(), " tensors: pass csr_schedule(rowptr, col)");
  }
  Csr csr_with(const at::Tensor& rowptr, const at::Tensor& col, at::TensorList s) const {
    Csr csr = device_csr_graph(rowptr, col);
    csr.incl = s[0];
    csr.segment_row = s[1];
    csr.heavy_row = s[2];
    return csr;
  }

  at::Tensor row_sums(const at::Tensor& rowptr, const at::Tensor& values) const {
    const int64_t n = num_rows(rowptr);
    at::Tensor out = at::zeros({n}, values.options());
    if (n == 0) return out;
    AT_DISPATCH_FLOATING_TYPES(values.scalar_type(), "row_sums", [&] {
      check_status(launch_row_sums<scalar_t>(rowptr.data_ptr<int64_t>(),
                                             values.data_ptr<scalar_t>(), n,
                                             out.data_ptr<scalar_t>(), stream()),
                   "row_sums");
    });
    return out;
  }

  std::pair<at::Tensor, at::Tensor> coefficients(const at::Tensor& chi, const at::Tensor& kappa,
                                                 double inv_mu) const {
    at::Tensor cy = at::empty_like(chi, at::MemoryFormat::Contiguous);
    at::Tensor rs = at::empty_like(chi, at::MemoryFormat::Contiguous);
    AT_DISPATCH_FLOATING_TYPES(chi.scalar_type(), "row_coefficients", [&] {
      check_status(launch_row_coefficients<scalar_t>(
                       chi.data_ptr<scalar_t>(), kappa.data_ptr<scalar_t>(),
                       static_cast<scalar_t>(inv_mu), chi.numel(), cy.data_ptr<scalar_t>(),
                       rs.data_ptr<scalar_t>(), stream()),
                   "row_coefficients");
    });
    return {cy, rs};
  }

  void edge_weights(const Csr& csr, const NeuralEdges& edges, at::Tensor& w,
                    at::Tensor& kappa) const {
    const int vec = vector_width(edges.p.scalar_type(), {edges.p.size(1)}, {&edges.p, &edges.q});
    RowPass pass(csr, 0, edges.p.size(1), true, RowPass::Sums::kNone, vec, edges.p.options());
    set_neural(pass, edges, w, kappa);
    pass.run(at::Tensor(), at::Tensor(), stream());
  }

  void fused_step(const Csr& csr, const NeuralEdges& edges, at::Tensor& w, at::Tensor& kappa,
                  const NeuralStep& step, const Iterates& z, int64_t iteration,
                  Residual& residual) const {
    const int64_t d = step.b.size(1), h = edges.p.size(1);
    const int vec = vector_width(step.b.scalar_type(), {d, h},
                                 {&step.b, &z.current, &z.next, &edges.p, &edges.q});
    RowPass pass(csr, d, h, true, RowPass::Sums::kNorms, vec, step.b.options());
    set_neural(pass, edges, w, kappa);
    pass.chi = step.chi;
    pass.inv_mu = step.inv_mu;
    pass.map.b = step.b;
    pass.converged = residual.converged();
    pass.run(z.current, z.next, stream());
    residual.record(pass, iteration);
  }

  void row_pass(const Csr& csr, const RowMap& map, const at::Tensor& y,
                const at::Tensor& out) const {
    cached_pass(csr, map, y, out, false).run(y, out, stream());
  }

  void row_product(const Csr& csr, const RowMap& map, const at::Tensor& y, const at::Tensor& out,
                   const at::Tensor& done, const at::Tensor& dots) const {
    const int64_t d = y.size(1);
    const int vec = vector_width(map.w.scalar_type(), {d}, {&y, &out});
    RowPass pass(csr, d, 0, false, RowPass::Sums::kDots, vec, map.w.options());
    pass.map = map;
    pass.done = done.data_ptr<double>();
    pass.product(y, out, dots, stream());
  }

  RowStep row_step(const Csr& csr, const RowMap& map, const Iterates& y,
                   Residual& residual) const {
    RowPass pass = cached_pass(csr, map, y.current, y.next, true);
    pass.converged = residual.converged();
    return RowStep(std::move(pass), residual, stream());
  }

  // Runs whether or not the solve has converged (no flag), counted by the finalize kernel.
  RowStep last_step(const Csr& csr, const RowMap& map, const Iterates& y,
                    Residual& residual) const {
    return RowStep(cached_pass(csr, map, y.current, y.next, true), residual, stream(), true);
  }

  // Symmetric graph (t_csr null): one pass over the CSR, both terms of every edge in its row.
  // Directed: the CSR's rows, then the transposed CSR's, accumulated.
  void neural_weight_grad(const Csr& csr, const Csr* t_csr, const NeuralEdges& edges,
                          const at::Tensor& t_a, const EdgeGradient& grad, at::Tensor& grad_p,
                          at::Tensor& grad_q) const {
    const int first = grad.given() ? kEdgeGradGiven
                                   : (t_csr != nullptr ? kEdgeGradOut : kEdgeGradSymmetric);
    gradient_pass(csr, edges.a, edges, first, grad.grad_w, grad, false, grad_p, grad_q);
    if (t_csr != nullptr) {
      const int second = grad.given() ? kEdgeGradGiven : kEdgeGradIn;
      gradient_pass(*t_csr, t_a, edges, second, grad.t_grad_w, grad, true, grad_p, grad_q);
    }
  }

  Residual first_iteration(const at::Tensor& b, double tol) const {
    return Residual(b, tol, stream());
  }

  void check_graph_data(const at::Tensor& rowptr, const at::Tensor& col,
                        const Transposed& t) const {
    check_graph_data_on_device(rowptr, col, t);
  }

 private:
  simt::Stream stream() const { return scope_.stream(); }

  static void set_neural(RowPass& pass, const NeuralEdges& edges, at::Tensor& w,
                         at::Tensor& kappa) {
    pass.edges = edges;
    pass.w_out = w;
    pass.kappa_out = kappa;
  }

  // A row pass with cached weights over the iterates y and out (`norms`: of a solve), stored in
  // the compute dtype (w's) or in 16 bits.
  RowPass cached_pass(const Csr& csr, const RowMap& map, const at::Tensor& y,
                      const at::Tensor& out, bool norms) const {
    const int64_t d = y.size(1);
    const int vec = vector_width(map.w.scalar_type(), {d}, {&map.b, &y, &out});
    RowPass pass(csr, d, 0, false, norms ? RowPass::Sums::kNorms : RowPass::Sums::kNone, vec,
                 map.w.options());
    pass.map = map;
    return pass;
  }

  // One gradient pass (neural_weight_grad_impl.cuh) over a CSR: `mode` says how dl/dW is known
  // (EdgeGradMode, launch.h), `given` holds it per edge for kEdgeGradGiven; a: the edge values
  // in this CSR's order; accumulate: add to grad_p and grad_q. A formed dl/dW's z and v are in
  // the compute dtype (p's) or both in one 16-bit dtype (float32 compute).
  void gradient_pass(const Csr& csr, const at::Tensor& a, const NeuralEdges& edges, int mode,
                     const at::Tensor& given, const EdgeGradient& grad, bool accumulate,
                     const at::Tensor& grad_p, const at::Tensor& grad_q) const {
    const at::Tensor& p = edges.p;
    const bool formed = mode != kEdgeGradGiven;
    const int64_t h = p.size(1), d = formed ? grad.z.size(1) : 0;
    const int vec = vector_width(p.scalar_type(), {h, d},
                                 {&p, &edges.q, &grad.z, &grad.v, &grad_p, &grad_q});
    const PassPlan plan = plan_pass(csr.n, csr.m, std::max(h, d) / vec, vec);
    at::Tensor partial = at::empty({max_heavy_slots(csr.m) * grad_partial_stride(h)}, p.options());
    at::Tensor scratch;
    if (h / vec > plan.group * kCudaVecsPerLane) {  // h spans several channel blocks
      scratch = at::empty({2 * std::max<int64_t>(csr.m, 1)}, p.options());
    }
    const auto run = [&](auto compute_tag, auto storage_tag) {
      using T = decltype(compute_tag);
      using S = decltype(storage_tag);
      NeuralWeightGradArgs<T, S> A;
      A.rowptr = csr.rowptr.data_ptr<int64_t>();
      A.col = csr.col.data_ptr<int32_t>();
      A.n = csr.n;
      A.m = csr.m;
      A.sched = csr.schedule();
      A.a = data_or_null<T>(a);
      A.p = p.data_ptr<T>();
      A.q = edges.q.data_ptr<T>();
      A.h = h;
      A.eps = static_cast<T>(edges.eps);
      A.mode = mode;
      A.given = data_or_null<T>(given);
      A.z = formed ? grad.z.data_ptr<S>() : nullptr;
      A.v = formed ? grad.v.data_ptr<S>() : nullptr;
      A.d = d;
      A.accumulate = accumulate;
      A.grad_p = grad_p.data_ptr<T>();
      A.grad_q = grad_q.data_ptr<T>();
      A.partial = partial.data_ptr<T>();
      A.edge_scratch = data_or_null<T>(scratch);
      A.plan = plan;
      check_status(launch_neural_weight_grad<T, S>(A, stream()), "neural_weight_grad");
    };
    ops::dispatch_stored(p.scalar_type(), formed ? grad.z.scalar_type() : p.scalar_type(),
                         "neural_weight_grad", run);
  }

  DeviceScope scope_;
};

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
