// CPU kernels behind the dignn ops. Each function is one pass over the CSR rows; the
// math is in csrc/dignn/laplacian_math.h. All tensors are contiguous, on the CPU, of one
// floating dtype (float or double); rowptr is int64, col int32 or int64.
#pragma once

#include <ATen/ATen.h>

namespace dignn {
namespace cpu {

// Sums that a pass reduces over all rows: ||out - y||^2 and ||out||^2 (the residual of
// one fixed-point step and the norm of its result).
struct StepNorms {
  double diff_sq = 0.0;
  double out_sq = 0.0;
};

// W_k and kappa_i = sum_k W_k (eq. 13-14). When `z` is defined this is the fused forward
// pass: it also writes z_next_i = x_i + cy_i z_i + ca_i (W Z)_i with the coefficients made
// from chi, the new kappa and mu (row_coefficients), and returns the step norms.
StepNorms neural_edge_pass(const at::Tensor& rowptr, const at::Tensor& col,
                           const at::Tensor& a, const at::Tensor& p, const at::Tensor& q,
                           double eps, at::Tensor& w, at::Tensor& kappa,
                           const at::Tensor& chi, const at::Tensor& x, const at::Tensor& z,
                           double inv_mu, at::Tensor& z_next);

// One fixed-point pass with cached edge weights:
//   out_i = b_i + cy_i y_i + rs_i * sum_k w_k y_{col_k}      (rs optional, undefined = 1)
// Forward:  b = X, rs = ca, w = W                 (CSR of W)
// Adjoint:  b = g, rs = 1,  w = W^T_ji ca_j       (CSR of W^T, scaled once per backward)
StepNorms cached_step(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& w,
                      const at::Tensor& b, const at::Tensor& cy, const at::Tensor& rs,
                      const at::Tensor& y, at::Tensor& out);

// The fused gradient pass: dl/dp and dl/dq of the neural edge weights, with the edge
// gradient G_ij either given per edge (`grad_w`, the backward of neural_edge_weights) or
// formed in the row from the adjoint v and the equilibrium z: G_ij = v_i . (z_j - z_i).
// With a transposed CSR (t_rowptr, t_col, t_a) the second-argument terms are gathered in
// the transposed row (directed graphs; `t_grad_w` then holds grad_w permuted the same
// way); without it the graph must be symmetric and both terms come from row i.
void neural_weight_grad_pass(const at::Tensor& rowptr, const at::Tensor& col,
                             const at::Tensor& a, const at::Tensor& p, const at::Tensor& q,
                             double eps, const at::Tensor& z, const at::Tensor& v,
                             const at::Tensor& grad_w, const at::Tensor& t_rowptr,
                             const at::Tensor& t_col, const at::Tensor& t_a,
                             const at::Tensor& t_grad_w, at::Tensor& grad_p,
                             at::Tensor& grad_q);

// The instruction set the CPU passes run with: "avx512", "avx2" or "generic".
const char* isa_name();

}  // namespace cpu
}  // namespace dignn
