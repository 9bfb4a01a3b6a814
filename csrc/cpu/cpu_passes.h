// The CPU's Passes (the interface in csrc/ops/passes.h): the kernels of kernels.h, and a solve's
// bookkeeping on the host.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "cpu/kernels.h"
#include "ops/checks.h"
#include "ops/passes.h"

namespace dignn {
namespace cpu {

// The stats of a solve from the norms of its last step, read on the host after every step.
class Residual {
 public:
  Residual(const at::Tensor& b, double tol);  // iteration 1: Y_1 = B from Y_0 = 0
  void record(const StepNorms& norms, int64_t iteration) {
    norms_ = norms;
    iterations_ = iteration;
  }
  // Converged (||Y_t - Y_{t-1}||^2 <= tol^2 ||Y_t||^2), or diverged: a norm that is no longer
  // finite (mu <= lambda_max, or float overflow of a growing iterate) ends the solve too, never
  // mistaken for convergence (inf <= inf); the stats then hold inf and the layer warns.
  bool stopped() const;
  at::Tensor stats() const;  // [iterations, ||Y_t - Y_{t-1}||_F, that over ||Y_t||_F]

 private:
  StepNorms norms_;
  int64_t iterations_ = 1;
  double tol_;
};

// The row pass of a solve.
class RowStep {
 public:
  RowStep(Csr csr, RowMap map, Residual& residual)
      : csr_(std::move(csr)), map_(std::move(map)), residual_(&residual) {}
  void run(const Iterates& y, int64_t iteration) const {
    residual_->record(row_pass(csr_, map_, y.current, y.next), iteration);
  }

 private:
  Csr csr_;
  RowMap map_;
  Residual* residual_;
};

class CpuPasses {
 public:
  using Csr = cpu::Csr;
  using Residual = cpu::Residual;
  using RowStep = cpu::RowStep;

  explicit CpuPasses(const at::Tensor&) {}

  // Anderson's record (the op anderson_record) runs here only: a GPU solve takes the Triton
  // record (dignn_kernels.solvers.anderson_update).
  static constexpr bool kAndersonRecord = true;
  void anderson_record(const at::Tensor& gy_new, const at::Tensor& y_new, const at::Tensor& f,
                       const at::Tensor& gy, at::Tensor& f_new, at::Tensor& d_f,
                       at::Tensor& d_g, int64_t slot, int64_t count, at::Tensor& sums) const {
    cpu::anderson_record(gy_new, y_new, f, gy, f_new, d_f, d_g, slot, count, sums);
  }

  Csr csr(const at::Tensor& rowptr, const at::Tensor& col) const {
    return {rowptr.contiguous(), col.contiguous()};
  }
  // The CPU kernels need no schedule (the op csr_schedule gives none).
  static std::vector<at::Tensor> schedule_of(const Csr&) { return {}; }
  static void check_schedule(at::TensorList s, const at::Tensor& rowptr, int64_t) {
    TORCH_CHECK(s.empty(), "schedule must be csr_schedule(rowptr, col) of this graph (no "
                "tensors on ", rowptr.device(), "), got ", s.size(),
                " tensors: pass csr_schedule(rowptr, col)");
  }
  Csr csr_with(const at::Tensor& rowptr, const at::Tensor& col, at::TensorList) const {
    return csr(rowptr, col);
  }
  at::Tensor row_sums(const at::Tensor& rowptr, const at::Tensor& values) const;
  std::pair<at::Tensor, at::Tensor> coefficients(const at::Tensor& chi, const at::Tensor& kappa,
                                                 double inv_mu) const;

  void edge_weights(const Csr& csr, const NeuralEdges& edges, at::Tensor& w,
                    at::Tensor& kappa) const {
    neural_edge_pass(csr, edges, w, kappa, nullptr, nullptr);
  }
  void fused_step(const Csr& csr, const NeuralEdges& edges, at::Tensor& w, at::Tensor& kappa,
                  const NeuralStep& step, const Iterates& z, int64_t iteration,
                  Residual& residual) const {
    residual.record(neural_edge_pass(csr, edges, w, kappa, &step, &z), iteration);
  }
  void row_pass(const Csr& csr, const RowMap& map, const at::Tensor& y,
                const at::Tensor& out) const {
    cpu::row_pass(csr, map, y, out);
  }
  // The host reads the flag; the row pass with b = 0, then the exact products summed in
  // float64 (as on the GPU, in another order).
  void row_product(const Csr& csr, const RowMap& map, const at::Tensor& y, const at::Tensor& out,
                   const at::Tensor& done, const at::Tensor& dots) const {
    if (*done.data_ptr<double>() != 0.0) {  // its first element
      dots.zero_();
      return;
    }
    cpu::row_pass(csr, RowMap{map.w, at::zeros_like(y), map.cy, map.rs}, y, out);
    dots.copy_(at::mul(out.to(at::kDouble), y.to(at::kDouble)).sum(0));
  }
  RowStep row_step(const Csr& csr, const RowMap& map, const Iterates&, Residual& residual) const {
    return RowStep(csr, map, residual);
  }
  // The host knows the iteration a solve stopped at: the last step is a row step.
  RowStep last_step(const Csr& csr, const RowMap& map, const Iterates& y,
                    Residual& residual) const {
    return row_step(csr, map, y, residual);
  }
  void neural_weight_grad(const Csr& csr, const Csr* t_csr, const NeuralEdges& edges,
                          const at::Tensor& t_a, const EdgeGradient& grad, at::Tensor& grad_p,
                          at::Tensor& grad_q) const {
    cpu::neural_weight_grad(csr, t_csr, edges, t_a, grad, grad_p, grad_q);
  }

  Residual first_iteration(const at::Tensor& b, double tol) const { return Residual(b, tol); }
  void check_graph_data(const at::Tensor& rowptr, const at::Tensor& col,
                        const Transposed& t) const {
    dignn::check_graph_data(rowptr, col, t);
  }
};

}  // namespace cpu
}  // namespace dignn
