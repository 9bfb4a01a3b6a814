// The dignn ops other than the implicit layer's solves (csrc/ops/solve.h), written once for
// every backend (a Passes class, csrc/ops/passes.h): the graph check, the neural edge weights
// and their backward, and the single row and gradient passes (which take 16-bit storage:
// csrc/ops/storage.h). Schemas in csrc/ops/schemas.cpp, math in csrc/dignn/laplacian_math.h.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "ops/checks.h"
#include "ops/passes.h"
#include "ops/solve.h"
#include "ops/storage.h"

namespace dignn {
namespace ops {

template <typename Passes>
void check_graph(const at::Tensor& rowptr, const at::Tensor& col, int64_t num_nodes,
                 const OptTensor& t_rowptr, const OptTensor& t_col, const OptTensor& t_perm) {
  const Transposed t = check_graph_args(rowptr, col, num_nodes, t_rowptr, t_col, t_perm);
  Passes(rowptr).check_graph_data(rowptr, col, t);
}

// W and kappa (eq. 13-14).
template <typename Passes>
std::tuple<at::Tensor, at::Tensor> neural_edge_weights(const at::Tensor& rowptr,
                                                       const at::Tensor& col, const at::Tensor& a,
                                                       const at::Tensor& p, const at::Tensor& q,
                                                       double eps) {
  const int64_t n =
      check_neural_edge_weights_args(rowptr, col, a, p, q, eps, /*storage16=*/true);
  const Passes passes(p);
  at::Tensor w = at::empty({col.numel()}, a.options());  // the compute dtype (16-bit p, q)
  at::Tensor kappa = at::empty({n}, a.options());
  if (n > 0) {
    passes.edge_weights(passes.csr(rowptr.contiguous(), col),
                        with_compute_projections(
                            NeuralEdges{a.contiguous(), p.contiguous(), q.contiguous(), eps}),
                        w, kappa);
  }
  return {w, kappa};
}

// dl/dp, dl/dq from dl/dW per edge.
template <typename Passes>
std::tuple<at::Tensor, at::Tensor> neural_edge_weights_backward(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a, const at::Tensor& p,
    const at::Tensor& q, double eps, const at::Tensor& grad_w, const at::Tensor& t_rowptr,
    const at::Tensor& t_col, const at::Tensor& t_perm) {
  const int64_t n = check_neural_edge_weights_backward_args(rowptr, col, a, p, q, eps, grad_w,
                                                            t_rowptr, t_col, t_perm);
  const Passes passes(p);
  at::Tensor grad_p = at::empty_like(p, at::MemoryFormat::Contiguous);
  at::Tensor grad_q = at::empty_like(q, at::MemoryFormat::Contiguous);
  if (n == 0) return {grad_p, grad_q};
  const NeuralEdges edges{a.contiguous(), p.contiguous(), q.contiguous(), eps};
  const at::Tensor gw = grad_w.contiguous();
  const at::Tensor perm = t_perm.contiguous();
  const typename Passes::Csr csr = passes.csr(rowptr.contiguous(), col);
  const typename Passes::Csr t_csr = passes.csr(t_rowptr.contiguous(), t_col);
  passes.neural_weight_grad(csr, &t_csr, edges, edges.a.index_select(0, perm),
                            EdgeGradient::per_edge(gw, gw.index_select(0, perm)), grad_p, grad_q);
  return {grad_p, grad_q};
}

// dl/dp, dl/dq with G_ij = v_i . (z_j - z_i).
template <typename Passes>
std::tuple<at::Tensor, at::Tensor> neural_weight_grad(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a, const at::Tensor& p,
    const at::Tensor& q, const at::Tensor& z, const at::Tensor& v, double eps,
    const OptTensor& t_rowptr, const OptTensor& t_col, const OptTensor& t_perm) {
  const Transposed t =
      check_neural_weight_grad_args(rowptr, col, a, p, q, z, v, eps, t_rowptr, t_col, t_perm);
  const Passes passes(z);
  // The gradients in the compute dtype, a's (16-bit p, q, z, v are storage).
  at::Tensor grad_p = at::empty(p.sizes(), a.options());
  at::Tensor grad_q = at::empty(q.sizes(), a.options());
  if (num_rows(rowptr) == 0) return {grad_p, grad_q};
  const typename Passes::Csr csr = passes.csr(rowptr.contiguous(), col);
  std::optional<typename Passes::Csr> t_csr;
  if (t.defined()) t_csr.emplace(passes.csr(t.rowptr, t.col));
  const EdgeGradient grad = stored_edge_gradient(
      EdgeGradient::from_adjoint(z.contiguous(), v.contiguous()), a.scalar_type());
  neural_weight_grad_from_adjoint(
      passes, csr, t_csr ? &*t_csr : nullptr, t,
      with_compute_projections(NeuralEdges{a.contiguous(), p.contiguous(), q.contiguous(), eps}),
      grad.z, grad.v, grad_p, grad_q);
  return {grad_p, grad_q};
}

// out = b + cy.y + rs.(W y), on the graph's csr_schedule when one is given (a solve's sweeps:
// made once), else on a schedule made in this call.
template <typename Passes>
at::Tensor csr_fma(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& w,
                   const at::Tensor& y, const at::Tensor& b, const at::Tensor& cy,
                   const at::Tensor& rs, std::optional<at::TensorList> schedule) {
  const int64_t n = check_csr_fma_args(rowptr, col, w, y, b, cy, rs);
  if (schedule) Passes::check_schedule(*schedule, rowptr, col.numel());
  const Passes passes(y);
  at::Tensor out = at::empty_like(y, at::MemoryFormat::Contiguous);
  if (n > 0) {
    const RowMap map{w.contiguous(), b.contiguous(), cy.contiguous(), rs.contiguous()};
    stored_row_pass(passes,
                    schedule ? passes.csr_with(rowptr, col, *schedule)
                             : passes.csr(rowptr.contiguous(), col),
                    map, y.contiguous(), out);
  }
  return out;
}

// The work schedule of a CSR as the backend's kernels read it (on the GPU: its segments and
// heavy rows, csrc/cuda/device_csr.h; none on the CPU), made once for the ops that take it
// instead of making it anew in every call (csr_fma, row_product).
template <typename Passes>
std::vector<at::Tensor> csr_schedule(const at::Tensor& rowptr, const at::Tensor& col) {
  check_csr(rowptr, col, "rowptr", "col");
  if (num_rows(rowptr) == 0) return {};
  return Passes::schedule_of(Passes(rowptr).csr(rowptr.contiguous(), col));
}

// cg's sweep w = A u with its dot products delta = w.u (the pass interface's row product,
// dignn_kernels/backends/interface.py): out = cy.y + rs.(W y) and dots[c] = sum_i out_ic y_ic,
// on the graph's csr_schedule; nothing written and dots 0 once done[0] != 0.
template <typename Passes>
at::Tensor row_product(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& w,
                       const at::Tensor& cy, const at::Tensor& rs, at::TensorList schedule,
                       const at::Tensor& y, const at::Tensor& out, const at::Tensor& done) {
  const int64_t n = check_row_product_args(rowptr, col, w, cy, rs, y, out, done);
  Passes::check_schedule(schedule, rowptr, col.numel());
  const int64_t d = y.size(1);
  if (n == 0 || d == 0) return at::zeros({d}, w.options());
  at::Tensor dots = at::empty({d}, w.options());
  const Passes passes(y);
  passes.row_product(passes.csr_with(rowptr, col, schedule),
                     RowMap{w.contiguous(), at::Tensor(), cy.contiguous(), rs.contiguous()},
                     y.contiguous(), out, done, dots);
  return dots;
}

// One forward step with cached weights: x - (1/mu) Delta z.
template <typename Passes>
at::Tensor diffusion_step(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& w,
                          const at::Tensor& chi, const at::Tensor& kappa, const at::Tensor& x,
                          const at::Tensor& z, double mu) {
  const int64_t n = check_diffusion_step_args(rowptr, col, w, chi, kappa, x, z, mu);
  const Passes passes(x);
  at::Tensor cy, rs;
  std::tie(cy, rs) = passes.coefficients(chi.contiguous(), kappa.contiguous(),
                                         checked_inverse_mu(mu, x.scalar_type()));
  at::Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  if (n > 0) {
    passes.row_pass(passes.csr(rowptr.contiguous(), col),
                    RowMap{w.contiguous(), x.contiguous(), cy, rs}, z.contiguous(), out);
  }
  return out;
}

// Anderson's record (dignn_kernels/solvers/anderson_update.py, AndersonVectors.record): f_new,
// the window's slot `slot` of d_f and d_g, and the float64 sums of the window's Gram system,
// in one pass; on a Passes with kAndersonRecord only (the CPU's).
template <typename Passes>
std::tuple<at::Tensor, at::Tensor> anderson_record(const at::Tensor& gy_new,
                                                   const at::Tensor& y_new, const at::Tensor& f,
                                                   const at::Tensor& gy, at::Tensor& d_f,
                                                   at::Tensor& d_g, int64_t slot,
                                                   int64_t count) {
  check_anderson_record_args(gy_new, y_new, f, gy, d_f, d_g, slot, count);
  at::Tensor f_new = at::empty_like(gy_new);
  at::Tensor sums =
      at::empty({1 + 2 * count, gy_new.size(1)}, gy_new.options().dtype(at::kDouble));
  Passes(gy_new).anderson_record(gy_new, y_new, f, gy, f_new, d_f, d_g, slot, count, sums);
  return {f_new, sums};
}

}  // namespace ops
}  // namespace dignn
