// The CPU kernels behind the dignn ops: each function is one pass over the CSR rows (the
// tensors' pointers handed to passes_impl.h, compiled for the widest instruction set this CPU
// has). The math is in csrc/dignn/laplacian_math.h. All tensors are contiguous, on the CPU, of
// one floating dtype (float or double).
#pragma once

#include <ATen/ATen.h>

#include "ops/passes.h"

namespace dignn {
namespace cpu {

// A CSR as the CPU kernels read it: rowptr int64 and col int32 or int64, both contiguous.
struct Csr {
  at::Tensor rowptr, col;
};

// Sums that a pass reduces over all rows: ||out - y||^2 and ||out||^2 (the residual of
// one fixed-point step and the norm of its result).
struct StepNorms {
  double diff_sq = 0.0;
  double out_sq = 0.0;
};

// W_k and kappa_i = sum_k W_k (eq. 13-14). With `step`, the fused forward pass: it also writes
// z.next_i = b_i + cy_i z.current_i + rs_i (W z.current)_i with the coefficients made from
// chi, the new kappa and inv_mu (row_coefficients), and returns the step norms.
StepNorms neural_edge_pass(const Csr& csr, const NeuralEdges& edges, at::Tensor& w,
                           at::Tensor& kappa, const NeuralStep* step, const Iterates* z);

// One fixed-point pass with cached edge weights (RowMap):
//   out_i = b_i + cy_i y_i + rs_i * sum_k w_k y_{col_k}      (rs undefined: 1)
// Forward:  b = X, rs = rs, w = W                 (CSR of W)
// Adjoint:  b = g, rs = 1,  w = W^T_ji rs_j       (CSR of W^T, scaled once per backward)
// out in y's dtype, or in the compute dtype (w's) from 16-bit y (a 16-bit solve's wide last
// iteration).
StepNorms row_pass(const Csr& csr, const RowMap& map, const at::Tensor& y,
                   const at::Tensor& out);

// The fused gradient pass: dl/dp and dl/dq of the neural edge weights, with the edge gradient
// G_ij given per edge or formed in the row (EdgeGradient). With a transposed CSR (t_csr, and
// t_a: the edge values in its order) the second-argument terms are gathered in the transposed
// row (directed graphs); without it the graph must be symmetric and both terms come from
// row i.
void neural_weight_grad(const Csr& csr, const Csr* t_csr, const NeuralEdges& edges,
                        const at::Tensor& t_a, const EdgeGradient& grad, at::Tensor& grad_p,
                        at::Tensor& grad_q);

// Anderson's record (passes_impl.h, anderson_record_t): writes f_new, the window's slot `slot`
// of d_f and d_g, and sums ([1 + 2 count, d] float64). Arguments as check_anderson_record_args
// (csrc/ops/checks.h) and f_new, sums allocated by the caller.
void anderson_record(const at::Tensor& gy_new, const at::Tensor& y_new, const at::Tensor& f,
                     const at::Tensor& gy, const at::Tensor& f_new, const at::Tensor& d_f,
                     const at::Tensor& d_g, int64_t slot, int64_t count,
                     const at::Tensor& sums);

// The instruction set the CPU passes run with: "avx512", "avx2" or "generic".
const char* isa_name();

}  // namespace cpu
}  // namespace dignn
