// CPU implementations of the dignn ops (schemas in csrc/ops/schemas.cpp).
#include <torch/library.h>

#include <cmath>
#include <tuple>
#include <utility>

#include "cpu/kernels.h"
#include "dignn/laplacian_math.h"
#include "ops/checks.h"

namespace dignn {
namespace cpu {
namespace {

using at::Tensor;

// (cy, ca) per row, see row_coefficients in laplacian_math.h.
std::pair<Tensor, Tensor> coefficient_vectors(const Tensor& chi, const Tensor& kappa,
                                              double inv_mu) {
  Tensor cy = at::empty_like(chi);
  Tensor ca = at::empty_like(chi);
  AT_DISPATCH_FLOATING_TYPES(chi.scalar_type(), "row_coefficients", [&] {
    const scalar_t* c = chi.data_ptr<scalar_t>();
    const scalar_t* k = kappa.data_ptr<scalar_t>();
    scalar_t* y = cy.data_ptr<scalar_t>();
    scalar_t* a = ca.data_ptr<scalar_t>();
    const scalar_t im = static_cast<scalar_t>(inv_mu);
    for (int64_t i = 0; i < chi.numel(); ++i) {
      const RowCoefficients<scalar_t> rc = row_coefficients(c[i], k[i], im);
      y[i] = rc.cy;
      a[i] = rc.ca;
    }
  });
  return {cy, ca};
}

// The adjoint's W^T (ca.u) as one CSR product: entry (j, i) of W^T carries W_ij ca_i.
Tensor adjoint_weights(const Tensor& t_w, const Tensor& ca, const Tensor& t_col) {
  return t_w * ca.index_select(0, t_col);
}

Tensor row_sums(const Tensor& rowptr, const Tensor& values) {
  const int64_t n = num_rows(rowptr);
  Tensor out = at::zeros({n}, values.options());
  if (values.numel() == 0) return out;
  Tensor counts = rowptr.narrow(0, 1, n) - rowptr.narrow(0, 0, n);
  Tensor rows = at::repeat_interleave(at::arange(n, rowptr.options()), counts);
  return out.index_add_(0, rows, values);
}

// [iterations, ||out - y||_F, ||out - y||_F / ||out||_F] of the last step of a solve.
Tensor stats_tensor(int64_t iters, const StepNorms& norms) {
  const double res = std::sqrt(norms.diff_sq);
  const double rel = norms.out_sq > 0.0 ? res / std::sqrt(norms.out_sq) : 0.0;
  return at::tensor({static_cast<double>(iters), res, rel}, at::kDouble);
}

// A step whose norms are no longer finite has diverged (mu <= lambda_max, or float overflow
// of a growing iterate): stop, never mistake inf <= inf for convergence. The stats then hold
// inf and the layer warns.
bool blew_up(const StepNorms& norms) {
  return !std::isfinite(norms.diff_sq) || !std::isfinite(norms.out_sq);
}

bool converged(const StepNorms& norms, double tol) {
  return !blew_up(norms) && norms.diff_sq <= tol * tol * norms.out_sq;
}

// ---------------------------------------------------------------- building blocks --

std::tuple<Tensor, Tensor> neural_edge_weights_cpu(const Tensor& rowptr, const Tensor& col,
                                                   const Tensor& a, const Tensor& p,
                                                   const Tensor& q, double eps) {
  const int64_t n = check_neural_edge_weights_args(rowptr, col, a, p, q, eps);
  Tensor w = at::empty({col.numel()}, p.options());
  Tensor kappa = at::empty({n}, p.options());
  Tensor none;
  neural_edge_pass(rowptr.contiguous(), col.contiguous(), a.contiguous(), p.contiguous(),
                   q.contiguous(), eps, w, kappa, none, none, none, 0.0, none);
  return {w, kappa};
}

std::tuple<Tensor, Tensor> neural_edge_weights_backward_cpu(
    const Tensor& rowptr, const Tensor& col, const Tensor& a, const Tensor& p,
    const Tensor& q, double eps, const Tensor& grad_w, const Tensor& t_rowptr,
    const Tensor& t_col, const Tensor& t_perm) {
  check_neural_edge_weights_backward_args(rowptr, col, a, p, q, eps, grad_w, t_rowptr, t_col,
                                          t_perm);
  Tensor ac = a.contiguous();
  Tensor gw = grad_w.contiguous();
  Tensor grad_p = at::empty_like(p, at::MemoryFormat::Contiguous);
  Tensor grad_q = at::empty_like(q, at::MemoryFormat::Contiguous);
  Tensor none;
  neural_weight_grad_pass(rowptr.contiguous(), col.contiguous(), ac, p.contiguous(),
                          q.contiguous(), eps, none, none, gw, t_rowptr.contiguous(),
                          t_col.contiguous(),
                          ac.index_select(0, t_perm), gw.index_select(0, t_perm), grad_p,
                          grad_q);
  return {grad_p, grad_q};
}

Tensor diffusion_step_cpu(const Tensor& rowptr, const Tensor& col, const Tensor& w,
                          const Tensor& chi, const Tensor& kappa, const Tensor& x,
                          const Tensor& z, double mu) {
  check_diffusion_step_args(rowptr, col, w, chi, kappa, x, z, mu);
  auto [cy, ca] = coefficient_vectors(chi.contiguous(), kappa.contiguous(), 1.0 / mu);
  Tensor out = at::empty_like(x, at::MemoryFormat::Contiguous);
  cached_step(rowptr.contiguous(), col.contiguous(), w.contiguous(), x.contiguous(), cy, ca,
              z.contiguous(), out);
  return out;
}

Tensor csr_fma_cpu(const Tensor& rowptr, const Tensor& col, const Tensor& w, const Tensor& y,
                   const Tensor& b, const Tensor& cy, const Tensor& rs) {
  check_csr_fma_args(rowptr, col, w, y, b, cy, rs);
  Tensor out = at::empty_like(y, at::MemoryFormat::Contiguous);
  cached_step(rowptr.contiguous(), col.contiguous(), w.contiguous(), b.contiguous(),
              cy.contiguous(), rs.contiguous(), y.contiguous(), out);
  return out;
}

std::tuple<Tensor, Tensor> neural_weight_grad_cpu(
    const Tensor& rowptr, const Tensor& col, const Tensor& a, const Tensor& p,
    const Tensor& q, const Tensor& z, const Tensor& v, double eps, const OptTensor& t_rowptr,
    const OptTensor& t_col, const OptTensor& t_perm) {
  const Transposed t =
      check_neural_weight_grad_args(rowptr, col, a, p, q, z, v, t_rowptr, t_col, t_perm);
  Tensor ac = a.contiguous();
  Tensor grad_p = at::empty_like(p, at::MemoryFormat::Contiguous);
  Tensor grad_q = at::empty_like(q, at::MemoryFormat::Contiguous);
  neural_weight_grad_pass(rowptr.contiguous(), col.contiguous(), ac, p.contiguous(),
                          q.contiguous(), eps, z.contiguous(), v.contiguous(), Tensor(), t.rowptr,
                          t.col,
                          t.defined() ? ac.index_select(0, t.perm) : Tensor(), Tensor(),
                          grad_p, grad_q);
  return {grad_p, grad_q};
}

// ----------------------------------------------------------------- the solve loops --

std::tuple<Tensor, Tensor, Tensor, Tensor> implicit_diffusion_cpu(
    const Tensor& rowptr, const Tensor& col, const Tensor& edge_value, const Tensor& x_in,
    const Tensor& chi_in, const OptTensor& p_in, const OptTensor& q_in,
    const OptTensor& kappa_in, double mu, double eps, int64_t max_iter, double tol,
    const OptTensor& t_rowptr, const OptTensor& t_col, const OptTensor& t_perm) {
  const bool neural = check_implicit_diffusion_args(rowptr, col, edge_value, x_in, chi_in, p_in,
                                                    q_in, kappa_in, mu, eps, max_iter, tol,
                                                    t_rowptr, t_col, t_perm);
  const int64_t n = num_rows(rowptr);
  const double inv_mu = 1.0 / mu;
  const Tensor x = x_in.contiguous();
  const Tensor chi = chi_in.contiguous();
  const Tensor rp = rowptr.contiguous();
  const Tensor colc = col.contiguous();
  const Tensor value = edge_value.contiguous();
  Tensor p, q;
  if (neural) {
    p = p_in->contiguous();
    q = q_in->contiguous();
  }

  // Iteration 1 from Z_0 = 0 gives Z_1 = X (eq. iter).
  Tensor z = x.clone();
  StepNorms norms;
  norms.diff_sq = norms.out_sq = x.square().sum(at::kDouble).item<double>();
  int64_t iters = 1;

  Tensor w, kappa, cy, ca;
  if (!neural) {
    w = value.clone();
    if (kappa_in.has_value()) {
      kappa = kappa_in->contiguous().clone();
    } else {
      kappa = row_sums(rp, value);
    }
    std::tie(cy, ca) = coefficient_vectors(chi, kappa, inv_mu);
  } else {
    w = at::empty({col.numel()}, x.options());
    kappa = at::empty({n}, x.options());
  }
  bool have_weights = !neural;
  Tensor z_next = at::empty_like(z);
  while (iters < max_iter && !converged(norms, tol) && !blew_up(norms)) {
    if (!have_weights) {
      // Iteration 2: the fused pass computes W, kappa and the step together.
      norms = neural_edge_pass(rp, colc, value, p, q, eps, w, kappa, chi, x, z, inv_mu,
                               z_next);
      std::tie(cy, ca) = coefficient_vectors(chi, kappa, inv_mu);
      have_weights = true;
    } else {
      norms = cached_step(rp, colc, w, x, cy, ca, z, z_next);
    }
    std::swap(z, z_next);
    ++iters;
  }
  if (!have_weights) {  // stopped at iteration 1; the backward still needs W
    Tensor none;
    neural_edge_pass(rp, colc, value, p, q, eps, w, kappa, none, none, none, 0.0, none);
  }
  return {z, w, kappa, stats_tensor(iters, norms)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> implicit_diffusion_backward_cpu(
    const Tensor& rowptr, const Tensor& col, const Tensor& edge_value, const Tensor& w,
    const Tensor& kappa_in, const OptTensor& t_rowptr, const OptTensor& t_col,
    const OptTensor& t_perm, const Tensor& x_in, const Tensor& chi_in, const OptTensor& p_in,
    const OptTensor& q_in, const Tensor& z_in, const Tensor& grad_z, double mu, double eps,
    int64_t max_iter, double tol) {
  const Transposed t = check_implicit_diffusion_backward_args(
      rowptr, col, edge_value, w, kappa_in, t_rowptr, t_col, t_perm, x_in, chi_in, p_in, q_in,
      z_in, grad_z, mu, eps, max_iter);
  const bool neural = p_in.has_value() && q_in.has_value();
  const double inv_mu = 1.0 / mu;
  const Tensor x = x_in.contiguous();
  const Tensor z = z_in.contiguous();
  const Tensor g = grad_z.contiguous();
  const Tensor chi = chi_in.contiguous();
  auto [cy, ca] = coefficient_vectors(chi, kappa_in.contiguous(), inv_mu);

  // Adjoint u = g + cy.u + W^T (ca.u), u_0 = 0 so u_1 = g; rows of W^T are the
  // transposed CSR, or the CSR itself on a symmetric graph.
  const Tensor wc = w.contiguous();
  const Tensor t_rp = t.defined() ? t.rowptr : rowptr.contiguous();
  const Tensor t_cl = t.defined() ? t.col : col.contiguous();
  const Tensor t_w = adjoint_weights(t.defined() ? wc.index_select(0, t.perm) : wc, ca, t_cl);
  Tensor u = g.clone();
  StepNorms norms;
  norms.diff_sq = norms.out_sq = g.square().sum(at::kDouble).item<double>();
  int64_t iters = 1;
  Tensor u_next = at::empty_like(u);
  while (iters < max_iter && !converged(norms, tol) && !blew_up(norms)) {
    norms = cached_step(t_rp, t_cl, t_w, g, cy, Tensor(), u, u_next);
    std::swap(u, u_next);
    ++iters;
  }

  // dl/dx = u; dl/dchi_i = u_i . (x_i - z_i) / chi_i (0 on guarded rows, where ca = 0).
  Tensor grad_chi = (u * (x - z)).sum(1) * ca * mu;
  Tensor grad_p, grad_q;
  if (neural) {
    Tensor v = u * ca.unsqueeze(1);
    Tensor ac = edge_value.contiguous();
    grad_p = at::empty_like(*p_in, at::MemoryFormat::Contiguous);
    grad_q = at::empty_like(*q_in, at::MemoryFormat::Contiguous);
    neural_weight_grad_pass(rowptr.contiguous(), col.contiguous(), ac, p_in->contiguous(),
                            q_in->contiguous(), eps, z, v, Tensor(), t.rowptr, t.col,
                            t.defined() ? ac.index_select(0, t.perm) : Tensor(), Tensor(),
                            grad_p, grad_q);
  } else {
    grad_p = at::empty({0}, x.options());
    grad_q = at::empty({0}, x.options());
  }
  return {u, grad_chi, grad_p, grad_q, stats_tensor(iters, norms)};
}

// ------------------------------------------------------------------ graph check --

void check_graph_cpu(const Tensor& rowptr, const Tensor& col, int64_t num_nodes,
                     const OptTensor& t_rowptr, const OptTensor& t_col,
                     const OptTensor& t_perm) {
  check_graph_data(rowptr, col, check_graph_args(rowptr, col, num_nodes, t_rowptr, t_col, t_perm));
}

}  // namespace

TORCH_LIBRARY_IMPL(dignn, CPU, m) {
  m.impl("check_graph", &check_graph_cpu);
  m.impl("neural_edge_weights", &neural_edge_weights_cpu);
  m.impl("neural_edge_weights_backward", &neural_edge_weights_backward_cpu);
  m.impl("diffusion_step", &diffusion_step_cpu);
  m.impl("csr_fma", &csr_fma_cpu);
  m.impl("neural_weight_grad", &neural_weight_grad_cpu);
  m.impl("implicit_diffusion", &implicit_diffusion_cpu);
  m.impl("implicit_diffusion_backward", &implicit_diffusion_backward_cpu);
}

}  // namespace cpu
}  // namespace dignn
