// The implicit layer's two solves, written once for every backend (a Passes class,
// csrc/ops/passes.h): dignn::implicit_diffusion, the forward fixed point
// Z = X - (1/mu) Delta Z (eq. iter), and dignn::implicit_diffusion_backward, the adjoint solve
// and the gradient pass (appendix "Training for DIGNNs"). Math in csrc/dignn/laplacian_math.h.
//
// 16-bit storage (storage_dtype bfloat16 or float16, float32 x): the iteration of the solvers'
// loop over the passes (dignn_kernels/solvers/loops.py), bit for bit and stop for stop. The
// iterates are stored in 16 bits from Y_1 = round(B) on, each row pass sums in float32 and
// rounds its output (csrc/ops/storage.h); the last iteration is computed from the last stored
// iterate but kept in float32 (wide_last_iteration). The step norms are of the iterates as
// stored, so a 16-bit iterate that no longer changes has converged. The neural weights take a
// pass of their own before the loop (the fused neural pass keeps its iterates in the compute
// dtype), and the gradient pass gathers z and v = rs.u rounded to 16 bits.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <utility>

#include "ops/checks.h"
#include "ops/interrupt.h"
#include "ops/passes.h"
#include "ops/storage.h"

namespace dignn {
namespace ops {

// 1/mu as the kernels take it, rounded to the compute dtype of x: a ValueError naming mu where
// it is not finite there (every coefficient 1/(mu chi_i) of eq. iter carries it), where the
// kernels would silently turn it into inf and NaN (dignn_kernels/laplacian.py
// check_inverse_mu says the same for the Python passes).
inline double checked_inverse_mu(double mu, at::ScalarType dtype) {
  const double inv_mu = 1.0 / mu;
  const bool is_double = dtype == at::kDouble;
  const double bound = is_double ? std::numeric_limits<double>::max()
                                 : static_cast<double>(std::numeric_limits<float>::max());
  TORCH_CHECK_VALUE(inv_mu <= bound, "mu=", mu, " is too small for ",
                    is_double ? "torch.float64" : "torch.float32", ": 1/mu is not finite in ",
                    is_double ? "torch.float64" : "torch.float32", " (mu must be >= 1/", bound,
                    " = ", 1.0 / bound, "), so the coefficients 1/(mu chi) of "
                    "Z = X - (1/mu) Delta Z overflow. Compute in torch.float64 or raise mu.");
  return inv_mu;
}

// Iterations t = 2..max_iter of a solve from Y_0 = 0 (iteration 1, Y_1 = B, is the caller's):
// `step(t)` writes Y_t to y.next from y.current and records its residual. The loop ends early
// when the residual says so (only where the backend reads it on the host, see passes.h), and
// a Ctrl-C ends it between iterations (csrc/ops/interrupt.h: the exception unwinds the op,
// whose outputs are dropped). Returns the last iteration it ran (1 if none).
template <typename Residual, typename Step>
int64_t fixed_point_iterations(const Residual& residual, int64_t max_iter, Iterates& y,
                               Step&& step) {
  InterruptPoll interrupt;
  int64_t last = 1;
  for (int64_t t = 2; t <= max_iter && !residual.stopped(); ++t) {
    step(t);
    y.advance();
    last = t;
    interrupt.poll();
  }
  return last;
}

// The dtype a solve of max_iter iterations stores its iterates in: the 16-bit storage_dtype,
// or Undefined for the compute dtype (also for one iteration, Z = X, which stores nothing).
inline at::ScalarType iterate_storage(const OptDtype& storage_dtype, int64_t max_iter) {
  return storage_dtype.has_value() && max_iter > 1 ? *storage_dtype : at::ScalarType::Undefined;
}

// Iteration 1 of a solve from Y_0 = 0: Y_1 = B as the solve stores it (rounded to the 16-bit
// storage dtype, else a copy), and the residual of Y_1 as stored (Passes::first_iteration
// widens 16-bit values to float32 as it reads them).
template <typename Passes>
std::pair<Iterates, typename Passes::Residual> start_solve(const Passes& passes,
                                                           const at::Tensor& b,
                                                           at::ScalarType storage, double tol) {
  if (storage == at::ScalarType::Undefined) {
    return {Iterates{b.clone(), at::Tensor()}, passes.first_iteration(b, tol)};
  }
  Iterates y{b.to(storage), at::Tensor()};
  typename Passes::Residual residual = passes.first_iteration(y.current, tol);
  return {std::move(y), std::move(residual)};
}

// t as a pass reads it in a solve: rounded to the 16-bit storage dtype, else t itself.
inline at::Tensor stored_as(const at::Tensor& t, at::ScalarType storage) {
  return storage != at::ScalarType::Undefined ? t.to(storage) : t;
}

// The last iteration of a solve with 16-bit iterates: map applied to the last stored iterate
// y.current (iteration `last`), read in 16 bits, its output in the compute dtype (b's), and
// recorded as iteration last + 1 (the device's residual counts from the iteration it stopped
// at).
template <typename Passes>
at::Tensor wide_last_iteration(const Passes& passes, const typename Passes::Csr& csr,
                               const RowMap& map, const Iterates& y, int64_t last,
                               typename Passes::Residual& residual) {
  const Iterates wide{y.current, at::empty_like(map.b)};
  passes.last_step(csr, map, wide, residual).run(wide, last + 1);
  return wide.next;
}

// dl/dp, dl/dq with G_ij = v_i . (z_j - z_i) (appendix "Training for DIGNNs"): one pass over
// the CSR on a symmetric graph, else one over the CSR and one over the transposed CSR t_csr.
template <typename Passes>
void neural_weight_grad_from_adjoint(const Passes& passes, const typename Passes::Csr& csr,
                                     const typename Passes::Csr* t_csr, const Transposed& t,
                                     const NeuralEdges& edges, const at::Tensor& z,
                                     const at::Tensor& v, at::Tensor& grad_p, at::Tensor& grad_q) {
  const at::Tensor t_a = t.defined() ? edges.a.index_select(0, t.perm) : at::Tensor();
  passes.neural_weight_grad(csr, t.defined() ? t_csr : nullptr, edges, t_a,
                            EdgeGradient::from_adjoint(z, v), grad_p, grad_q);
}

// stats = [iterations, ||Z_t - Z_{t-1}||_F, that over ||Z_t||_F] (schemas.cpp).
template <typename Passes>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> implicit_diffusion(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& edge_value,
    const at::Tensor& x_in, const at::Tensor& chi_in, const OptTensor& p_in,
    const OptTensor& q_in, const OptTensor& kappa_in, double mu, double eps, int64_t max_iter,
    double tol, const OptTensor& t_rowptr, const OptTensor& t_col, const OptTensor& t_perm,
    const OptDtype& storage_dtype) {
  const bool neural = check_implicit_diffusion_args(rowptr, col, edge_value, x_in, chi_in, p_in,
                                                    q_in, kappa_in, mu, eps, max_iter, tol,
                                                    t_rowptr, t_col, t_perm, storage_dtype);
  const Passes passes(x_in);
  const int64_t n = num_rows(rowptr);
  const double inv_mu = checked_inverse_mu(mu, x_in.scalar_type());
  const at::Tensor x = x_in.contiguous();
  const at::Tensor chi = chi_in.contiguous();
  const at::Tensor rp = rowptr.contiguous();
  const at::Tensor value = edge_value.contiguous();
  const at::ScalarType storage = iterate_storage(storage_dtype, max_iter);
  const bool stored = storage != at::ScalarType::Undefined;  // 16-bit iterates (file's head)

  // Iteration 1 from Z_0 = 0 gives Z_1 = X (eq. iter), stored as Z_1 = round(X).
  auto start = start_solve(passes, x, storage, tol);
  Iterates& z = start.first;
  typename Passes::Residual& residual = start.second;
  if (n == 0) z.current = x.clone();

  // Fixed weights: W = edge_value, kappa given or its row sums. Neural (eq. 13-14): made by
  // the pass of iteration 2 together with the step (with 16-bit iterates: before the loop).
  at::Tensor w, kappa, cy, rs;
  if (neural) {
    w = at::empty({col.numel()}, x.options());
    kappa = at::empty({n}, x.options());
  } else {
    w = value.clone();
    kappa = kappa_in.has_value() ? kappa_in->contiguous().clone() : passes.row_sums(rp, value);
    std::tie(cy, rs) = passes.coefficients(chi, kappa, inv_mu);
  }
  if (n == 0) return {z.current, w, kappa, residual.stats()};

  const typename Passes::Csr csr = passes.csr(rp, col);
  const NeuralEdges edges{value, neural ? p_in->contiguous() : at::Tensor(),
                          neural ? q_in->contiguous() : at::Tensor(), eps};
  if (neural && stored) {
    passes.edge_weights(csr, edges, w, kappa);
    std::tie(cy, rs) = passes.coefficients(chi, kappa, inv_mu);
  }
  z.next = at::empty_like(z.current);
  // z_i <- x_i + cy_i z_i + rs_i (W Z)_i with cached weights (row_coefficients).
  std::optional<typename Passes::RowStep> step;
  if (cy.defined()) step.emplace(passes.row_step(csr, RowMap{w, x, cy, rs}, z, residual));
  const int64_t last =
      fixed_point_iterations(residual, stored ? max_iter - 1 : max_iter, z, [&](int64_t t) {
        if (step) {
          step->run(z, t);
          return;
        }
        passes.fused_step(csr, edges, w, kappa, NeuralStep{chi, inv_mu, x}, z, t, residual);
        std::tie(cy, rs) = passes.coefficients(chi, kappa, inv_mu);
        step.emplace(passes.row_step(csr, RowMap{w, x, cy, rs}, z, residual));
      });
  if (!step) passes.edge_weights(csr, edges, w, kappa);  // stopped at iteration 1: the
                                                         // backward still needs W and kappa
  if (stored) {
    return {wide_last_iteration(passes, csr, RowMap{w, x, cy, rs}, z, last, residual), w, kappa,
            residual.stats()};
  }
  return {z.current, w, kappa, residual.stats()};
}

// The adjoint u = dl/dX of u = g + cy.u + W^T (rs.u) (the paper's u = g - (1/mu) Delta^T u),
// then dl/dchi and, for the neural Laplacian, dl/dp and dl/dq; stats of the adjoint solve.
template <typename Passes>
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
implicit_diffusion_backward(const at::Tensor& rowptr, const at::Tensor& col,
                            const at::Tensor& edge_value, const at::Tensor& w,
                            const at::Tensor& kappa_in, const OptTensor& t_rowptr,
                            const OptTensor& t_col, const OptTensor& t_perm,
                            const at::Tensor& x_in, const at::Tensor& chi_in,
                            const OptTensor& p_in, const OptTensor& q_in, const at::Tensor& z_in,
                            const at::Tensor& grad_z, double mu, double eps, int64_t max_iter,
                            double tol, const OptDtype& storage_dtype) {
  const Transposed t = check_implicit_diffusion_backward_args(
      rowptr, col, edge_value, w, kappa_in, t_rowptr, t_col, t_perm, x_in, chi_in, p_in, q_in,
      z_in, grad_z, mu, eps, max_iter, tol, storage_dtype);
  const bool neural = p_in.has_value() && q_in.has_value();
  const Passes passes(x_in);
  const int64_t n = num_rows(rowptr);
  const at::Tensor x = x_in.contiguous();
  const at::Tensor z = z_in.contiguous();
  const at::Tensor g = grad_z.contiguous();
  const at::Tensor rp = rowptr.contiguous();
  at::Tensor cy, rs;
  std::tie(cy, rs) = passes.coefficients(chi_in.contiguous(), kappa_in.contiguous(),
                                         checked_inverse_mu(mu, x_in.scalar_type()));

  // Rows of W^T are the transposed CSR, or the CSR itself on a symmetric graph; entry (j, i)
  // of W^T carries W_ij rs_i, so that one row pass with unit row scales makes W^T (rs.u).
  const at::Tensor wc = w.contiguous();
  const at::Tensor t_rp = t.defined() ? t.rowptr : rp;
  const at::Tensor t_cl = t.defined() ? t.col : col.contiguous();
  const at::Tensor t_w =
      (t.defined() ? wc.index_select(0, t.perm) : wc) * rs.index_select(0, t_cl);
  // u_0 = 0, so u_1 = g (stored as round(g) with 16-bit iterates, see the file's head).
  const at::ScalarType storage = iterate_storage(storage_dtype, max_iter);
  const bool stored = storage != at::ScalarType::Undefined;
  auto start = start_solve(passes, g, storage, tol);
  Iterates& u = start.first;
  typename Passes::Residual& residual = start.second;
  at::Tensor adjoint = n > 0 ? u.current : g.clone();  // u
  std::optional<typename Passes::Csr> t_csr;
  if (n > 0) {
    t_csr.emplace(passes.csr(t_rp, t_cl));
    u.next = at::empty_like(u.current);
    const RowMap map{t_w, g, cy, at::Tensor()};
    const typename Passes::RowStep step = passes.row_step(*t_csr, map, u, residual);
    const int64_t last = fixed_point_iterations(residual, stored ? max_iter - 1 : max_iter, u,
                                                [&](int64_t it) { step.run(u, it); });
    adjoint = stored ? wide_last_iteration(passes, *t_csr, map, u, last, residual) : u.current;
  }

  // dl/dx = u; dl/dchi_i = u_i . (x_i - z_i) / chi_i (0 on guarded rows, where rs = 0).
  at::Tensor grad_chi = (adjoint * (x - z)).sum(1) * rs * mu;
  at::Tensor grad_p, grad_q;
  if (neural) {
    // The gradient pass gathers z and v = rs.u, rounded to the 16-bit storage dtype if any.
    const at::Tensor v = stored_as(adjoint * rs.unsqueeze(1), storage);
    grad_p = at::empty_like(*p_in, at::MemoryFormat::Contiguous);
    grad_q = at::empty_like(*q_in, at::MemoryFormat::Contiguous);
    if (n > 0) {
      // On a symmetric graph the adjoint's CSR is the graph's own.
      const typename Passes::Csr csr = t.defined() ? passes.csr(rp, col) : *t_csr;
      const NeuralEdges edges{edge_value.contiguous(), p_in->contiguous(), q_in->contiguous(),
                              eps};
      neural_weight_grad_from_adjoint(passes, csr, &*t_csr, t, edges, stored_as(z, storage), v,
                                grad_p, grad_q);
    }
  } else {
    grad_p = at::empty({0}, x.options());
    grad_q = at::empty({0}, x.options());
  }
  return {adjoint, grad_chi, grad_p, grad_q, residual.stats()};
}

}  // namespace ops
}  // namespace dignn
