// One row pass of the GPU (RowPassArgs, launch.h) on tensors: the launch plan and the heavy-row
// buffers are made once, and run() names the pointers of the given iterates and launches, so a
// solve repeats one pass on its two iterates.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <algorithm>
#include <cstdint>

#include "cuda/device_csr.h"
#include "cuda/device_scope.h"
#include "cuda/launch.h"
#include "ops/passes.h"
#include "ops/storage.h"

namespace dignn {
namespace DIGNN_SIMT_NS {

class RowPass {
 public:
  // What a pass adds up besides its output: nothing, the per-block step norms of a solve (see
  // finalize), or the row product's dots (see product).
  enum class Sums { kNone, kNorms, kDots };

  // d: channels of the iterates (0: only the neural weights); neural: the weights are made in
  // the pass from `edges` (h channels of p, q); vec: elements per channel vector
  // (vector_width); opts: of the compute dtype (the iterates may be stored in 16 bits,
  // launch.h).
  RowPass(const DeviceCsr& csr, int64_t d, int64_t h, bool neural, Sums sums, int vec,
          const at::TensorOptions& opts)
      : csr_(csr), d_(d), h_(h), neural_(neural), dtype_(opts.dtype().toScalarType()) {
    plan_ = plan_pass(csr.n, csr.m, std::max(d, neural ? h : int64_t(0)) / vec, vec);
    partial_ = at::empty({max_heavy_slots(csr.m) * std::max<int64_t>(d, 1)}, opts);
    if (neural) partial_kappa_ = at::empty({max_heavy_slots(csr.m)}, opts);
    const auto dopts = opts.dtype(at::kDouble);
    if (sums == Sums::kNorms) {
      main_norms_ = at::empty({std::max<int64_t>(plan_.main_blocks, 1), 2}, dopts);
      combine_norms_ = at::empty({std::max<int64_t>(plan_.combine_blocks, 1), 2}, dopts);
    } else if (sums == Sums::kDots) {
      main_dots_ = at::empty({plan_.main_blocks, d}, dopts);
    }
  }

  // What the pass reads and writes besides the iterates (undefined: not used).
  RowMap map;                  // cached weights w, cy, rs (rs undefined: 1); b of any step
  NeuralEdges edges{};         // neural: a, p, q, eps
  at::Tensor w_out, kappa_out;  // neural: the weights and their row sums
  at::Tensor chi;              // neural step: (cy, rs) = row_coefficients(chi, kappa, inv_mu)
  double inv_mu = 0.0;
  const int32_t* converged = nullptr;  // a solve's flag: once set, out = y
  const double* done = nullptr;        // the row product's (cg's) flag: once set, no writes

  // out = b + cy y + rs (W y), or only the neural weights when y is undefined. y and out in
  // the compute dtype, or (cached weights, float32 compute) y in a 16-bit dtype and out in
  // that dtype or (a 16-bit solve's wide last iteration) in float32.
  void run(const at::Tensor& y, const at::Tensor& out, simt::Stream stream) const {
    if (csr_.n == 0) return;
    TORCH_INTERNAL_ASSERT(!neural_ || !y.defined() || y.scalar_type() == dtype_,
                          "neural row pass of ", y.scalar_type(), " iterates");
    const bool wide_out = y.defined() && out.scalar_type() != y.scalar_type();
    TORCH_INTERNAL_ASSERT(!wide_out || out.scalar_type() == dtype_, "row pass of ",
                          y.scalar_type(), " iterates into ", out.scalar_type());
    ops::dispatch_stored(dtype_, y.defined() ? y.scalar_type() : dtype_, "row_pass",
                         [&](auto compute_tag, auto storage_tag) {
                           using T = decltype(compute_tag);
                           using S = decltype(storage_tag);
                           check_status(wide_out ? launch_row_pass(args<T, S, T>(y, out), stream)
                                                 : launch_row_pass(args<T, S, S>(y, out), stream),
                                        "row_pass");
                         });
  }

  // The row product (Sums::kDots; done set): out = cy y + rs (W y) and dots[c] = sum_i out_ic
  // y_ic (in the compute dtype, summed in float64), nothing written and dots 0 once done.
  void product(const at::Tensor& y, const at::Tensor& out, const at::Tensor& dots,
               simt::Stream stream) const {
    run(y, out, stream);
    AT_DISPATCH_FLOATING_TYPES(dtype_, "row_product_dots", [&] {
      check_status(launch_row_product_dots<scalar_t>(
                       main_dots_.data_ptr<double>(), plan_.main_blocks, csr_.schedule(),
                       y.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), d_, done,
                       dots.data_ptr<scalar_t>(), stream),
                   "row_product_dots");
    });
  }

  // The solve's stats and flag from this pass's norms, at iteration `iteration` (last: see
  // launch_finalize_step).
  void finalize(const at::Tensor& stats, const at::Tensor& flag, int64_t iteration, double tol,
                bool last, simt::Stream stream) const {
    const bool any = csr_.n > 0;
    check_status(launch_finalize_step(main_norms_.data_ptr<double>(),
                                      any ? plan_.main_blocks : 0,
                                      combine_norms_.data_ptr<double>(),
                                      any ? plan_.combine_blocks : 0, stats.data_ptr<double>(),
                                      flag.data_ptr<int32_t>(), iteration, tol, last, stream),
                 "finalize_step");
  }

 private:
  template <typename T, typename S, typename O>
  RowPassArgs<T, S, O> args(const at::Tensor& y, const at::Tensor& out) const {
    RowPassArgs<T, S, O> A;
    A.neural = neural_;
    A.rowptr = csr_.rowptr.data_ptr<int64_t>();
    A.col = csr_.col.data_ptr<int32_t>();
    A.n = csr_.n;
    A.m = csr_.m;
    A.sched = csr_.schedule();
    A.w = data_or_null<T>(map.w);
    A.a = data_or_null<T>(edges.a);
    A.p = data_or_null<T>(edges.p);
    A.q = data_or_null<T>(edges.q);
    A.h = h_;
    A.eps = static_cast<T>(edges.eps);
    A.w_out = data_or_null<T>(w_out);
    A.kappa_out = data_or_null<T>(kappa_out);
    A.b = data_or_null<T>(map.b);
    A.y = data_or_null<S>(y);
    A.out = data_or_null<O>(out);
    A.d = d_;
    A.cy = data_or_null<T>(map.cy);
    A.rs = data_or_null<T>(map.rs);
    A.chi = data_or_null<T>(chi);
    A.inv_mu = static_cast<T>(inv_mu);
    A.partial = partial_.data_ptr<T>();
    A.partial_kappa = data_or_null<T>(partial_kappa_);
    A.converged = converged;
    A.main_norms = data_or_null<double>(main_norms_);
    A.combine_norms = data_or_null<double>(combine_norms_);
    A.done = done;
    A.dots = data_or_null<double>(main_dots_);
    A.plan = plan_;
    return A;
  }

  DeviceCsr csr_;
  int64_t d_, h_;
  bool neural_;
  at::ScalarType dtype_;
  PassPlan plan_;
  at::Tensor partial_, partial_kappa_, main_norms_, combine_norms_, main_dots_;
};

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
