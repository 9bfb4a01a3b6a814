// What the dignn ops (csrc/ops/building_blocks.h, csrc/ops/solve.h; written once for every
// backend) ask of a backend's kernels: a *Passes* class, csrc/cpu/cpu_passes.h for the CPU and
// csrc/cuda/device_passes.h for the GPU (also run by the kernels' host emulator).
//
//   class Passes {
//     explicit Passes(const at::Tensor& like);  // on like's device (a GPU: guard and stream)
//
//     using Csr = ...;       // a CSR as the kernels read it, made by csr()
//     using Residual = ...;  // the bookkeeping of a solve, below
//     using RowStep = ...;   // the row pass of a solve: RowStep::run(const Iterates&, t)
//
//     Csr csr(const at::Tensor& rowptr, const at::Tensor& col) const;  // (n > 0)
//     // The work schedule of a Csr as tensors (the op csr_schedule; none on the CPU), their
//     // shape check, and the Csr made with them instead of anew.
//     static std::vector<at::Tensor> schedule_of(const Csr&);
//     static void check_schedule(at::TensorList schedule, const at::Tensor& rowptr, int64_t m);
//     Csr csr_with(const at::Tensor& rowptr, const at::Tensor& col, at::TensorList) const;
//     at::Tensor row_sums(const at::Tensor& rowptr, const at::Tensor& values) const;
//     // (cy, rs) per row: row_coefficients of laplacian_math.h
//     std::pair<at::Tensor, at::Tensor> coefficients(chi, kappa, double inv_mu) const;
//
//     // The neural edge-weight pass: W and kappa_i = sum_j W_ij (eq. 13-14).
//     void edge_weights(const Csr&, const NeuralEdges&, at::Tensor& w, at::Tensor& kappa) const;
//     // The same pass fused with iteration t of a solve (NeuralStep): also writes z.next from
//     // z.current and records the step in the residual.
//     void fused_step(const Csr&, const NeuralEdges&, at::Tensor& w, at::Tensor& kappa,
//                     const NeuralStep&, const Iterates& z, int64_t t, Residual&) const;
//     // The row pass (the op csr_fma), RowMap. y and out may be stored in bfloat16 or float16
//     // when the compute dtype (w's) is float32 (csrc/ops/storage.h), out in y's dtype or,
//     // from 16-bit y (the wide last iteration below), in float32.
//     void row_pass(const Csr&, const RowMap&, const at::Tensor& y, const at::Tensor& out) const;
//     // The row product of a cg sweep (the op row_product): out = cy.y + rs.(W y) (map.b
//     // undefined: 0) and dots[c] = sum_i out_ic y_ic, with the exact products summed in
//     // float64 and dots in the compute dtype; once the float64 flag done[0] is nonzero,
//     // nothing is written to out and dots are 0. y and out in the compute dtype.
//     void row_product(const Csr&, const RowMap&, const at::Tensor& y, const at::Tensor& out,
//                      const at::Tensor& done, const at::Tensor& dots) const;
//     // The row pass of a solve: its run(y, t) writes y.next from y.current and records the
//     // step in the residual it was made with.
//     RowStep row_step(const Csr&, const RowMap&, const Iterates& y, Residual&) const;
//     // The wide last iteration of a solve with 16-bit iterates (csrc/ops/solve.h): a row step
//     // from y.current in 16 bits into y.next in the compute dtype (float32; no widened copy
//     // of y) that runs even when the solve has stopped, and records
//     // itself as the iteration after the last one the residual recorded (its run(y, t) names
//     // that t where the host knows it; on the GPU the device flag decides).
//     RowStep last_step(const Csr&, const RowMap&, const Iterates& y, Residual&) const;
//     // The gradient pass: dl/dp, dl/dq of the neural edge weights over the CSR, and over the
//     // transposed CSR t_csr (directed graphs; t_a: the edge values in its order) unless it
//     // is null (a symmetric graph). A formed dl/dW's z and v may be stored in one 16-bit
//     // dtype when the compute dtype is float32 (storage.h); p and q are in the compute dtype.
//     void neural_weight_grad(const Csr&, const Csr* t_csr, const NeuralEdges&,
//                             const at::Tensor& t_a, const EdgeGradient&, at::Tensor& grad_p,
//                             at::Tensor& grad_q) const;
//
//     // Y_1 = B (Y_0 = 0); b in the compute dtype or (a 16-bit solve) in 16 bits with float32
//     // compute.
//     Residual first_iteration(const at::Tensor& b, double tol) const;
//     // The data checks of dignn::check_graph (csrc/ops/checks.h).
//     void check_graph_data(rowptr, col, const Transposed&) const;
//   };
//
//   Residual: the stats of a solve, [iterations, ||Y_t - Y_{t-1}||_F, that over ||Y_t||_F],
//   with `bool stopped() const` (whether the host may end the loop: the solve converged,
//   ||Y_t - Y_{t-1}|| <= tol ||Y_t||, or its norms are no longer finite) and
//   `at::Tensor stats() const` (float64 [3]). The CPU reads its norms on the host after every
//   step. The GPU never does (stopped() is false): a device flag marks convergence, later steps
//   only carry the result forward, and the stats are written on the device, so a solve never
//   synchronizes with the host.
//
// Tensors reach a Passes contiguous, of one floating dtype, on one device; n is the number of
// rows (nodes).
#pragma once

#include <ATen/ATen.h>

#include <utility>

namespace dignn {

// The two iterates of a fixed-point solve (eq. iter): a step reads current, Y_{t-1}, and
// writes next, Y_t; advance() then makes Y_t current.
struct Iterates {
  at::Tensor current;
  at::Tensor next;
  void advance() { std::swap(current, next); }
};

// The fixed-point map of one row pass (eq. iter): out_i = b_i + cy_i y_i + rs_i (W y)_i with
// (W y)_i = sum_k w_k y_{col_k}; rs undefined: 1. The forward step of fixed weights has b = X,
// cy = -kappa/(mu chi), rs = 1/(mu chi); the adjoint step runs on the CSR of W^T with b = g,
// rs = 1 and the weights scaled by the coefficient of their column (laplacian_math.h).
struct RowMap {
  at::Tensor w, b, cy, rs;
};

// The forward step made in the same pass as the neural weights: b = X and the row
// coefficients (cy, rs) = row_coefficients(chi_i, kappa_i, inv_mu) of the new kappa.
struct NeuralStep {
  at::Tensor chi;
  double inv_mu;
  at::Tensor b;
};

// The inputs of the neural edge weights (eq. 13-14): the edge values a (per edge, CSR order),
// the node projections p and q (n x h), and eps.
struct NeuralEdges {
  at::Tensor a, p, q;
  double eps;
};

// dl/dW of the edges for the gradient pass: given per edge (grad_w in the CSR's order and
// t_grad_w in the transposed CSR's: the backward of neural_edge_weights), or formed in the row
// from the adjoint v and the equilibrium z, G_ij = v_i . (z_j - z_i) (the implicit layer's
// backward, appendix "Training for DIGNNs").
struct EdgeGradient {
  at::Tensor grad_w, t_grad_w;  // given
  at::Tensor z, v;              // formed
  bool given() const { return grad_w.defined(); }

  static EdgeGradient per_edge(const at::Tensor& grad_w, const at::Tensor& t_grad_w) {
    return {grad_w, t_grad_w, at::Tensor(), at::Tensor()};
  }
  static EdgeGradient from_adjoint(const at::Tensor& z, const at::Tensor& v) {
    return {at::Tensor(), at::Tensor(), z, v};
  }
};

}  // namespace dignn
