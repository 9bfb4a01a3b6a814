// CPU row passes: neural edge weights (optionally fused with the forward step) and the
// cached-weight fixed-point step. Math: csrc/dignn/laplacian_math.h.
#include <ATen/Dispatch.h>

#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel_rows.h"
#include "dignn/laplacian_math.h"

namespace dignn {
namespace cpu {
namespace {

template <typename scalar_t>
inline scalar_t dot(const scalar_t* __restrict__ u, const scalar_t* __restrict__ v,
                    int64_t len) {
  scalar_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < len; ++c) s += u[c] * v[c];
  return s;
}

template <typename scalar_t>
inline scalar_t dist_sq(const scalar_t* __restrict__ u, const scalar_t* __restrict__ v,
                        int64_t len) {
  scalar_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t c = 0; c < len; ++c) {
    const scalar_t t = u[c] - v[c];
    s += t * t;
  }
  return s;
}

template <typename scalar_t>
inline void axpy(scalar_t alpha, const scalar_t* __restrict__ x, scalar_t* __restrict__ y,
                 int64_t len) {
#pragma omp simd
  for (int64_t c = 0; c < len; ++c) y[c] += alpha * x[c];
}

// out_i = b_i + cy z_i + ca acc_i; returns (||out_i - z_i||^2, ||out_i||^2) of the row.
template <typename scalar_t>
inline void finish_row(const scalar_t* __restrict__ b, const scalar_t* __restrict__ y,
                       const scalar_t* __restrict__ acc, scalar_t cy, scalar_t ca,
                       scalar_t* __restrict__ out, int64_t d, double& diff_sq,
                       double& out_sq) {
  scalar_t ds = 0, os = 0;
#pragma omp simd reduction(+ : ds, os)
  for (int64_t c = 0; c < d; ++c) {
    const scalar_t o = b[c] + cy * y[c] + ca * acc[c];
    const scalar_t t = o - y[c];
    out[c] = o;
    ds += t * t;
    os += o * o;
  }
  diff_sq += static_cast<double>(ds);
  out_sq += static_cast<double>(os);
}

StepNorms reduce_norms(const std::vector<StepNorms>& parts) {
  StepNorms total;
  for (const auto& p : parts) {  // chunk order: deterministic
    total.diff_sq += p.diff_sq;
    total.out_sq += p.out_sq;
  }
  return total;
}

template <typename scalar_t, typename index_t, bool kUpdate>
StepNorms neural_edge_pass_impl(const at::Tensor& rowptr_t, const at::Tensor& col_t,
                                const at::Tensor& a_t, const at::Tensor& p_t,
                                const at::Tensor& q_t, double eps_d, at::Tensor& w_t,
                                at::Tensor& kappa_t, const at::Tensor& chi_t,
                                const at::Tensor& x_t, const at::Tensor& z_t,
                                double inv_mu_d, at::Tensor& z_next_t) {
  const int64_t n = rowptr_t.numel() - 1;
  const int64_t h = p_t.size(1);
  const int64_t d = kUpdate ? x_t.size(1) : 0;
  const int64_t* rowptr = rowptr_t.data_ptr<int64_t>();
  const index_t* col = col_t.data_ptr<index_t>();
  const scalar_t* a = a_t.data_ptr<scalar_t>();
  const scalar_t* p = p_t.data_ptr<scalar_t>();
  const scalar_t* q = q_t.data_ptr<scalar_t>();
  scalar_t* w = w_t.data_ptr<scalar_t>();
  scalar_t* kappa = kappa_t.data_ptr<scalar_t>();
  const scalar_t* chi = kUpdate ? chi_t.data_ptr<scalar_t>() : nullptr;
  const scalar_t* x = kUpdate ? x_t.data_ptr<scalar_t>() : nullptr;
  const scalar_t* z = kUpdate ? z_t.data_ptr<scalar_t>() : nullptr;
  scalar_t* z_next = kUpdate ? z_next_t.data_ptr<scalar_t>() : nullptr;
  const scalar_t eps = static_cast<scalar_t>(eps_d);
  const scalar_t inv_mu = static_cast<scalar_t>(inv_mu_d);

  const RowChunks chunks = balanced_row_chunks(rowptr, n);
  std::vector<StepNorms> parts(chunks.size());
  parallel_for_rows(chunks, [&](int64_t chunk, int64_t row_begin, int64_t row_end) {
    std::vector<scalar_t> acc(d);
    StepNorms local;
    for (int64_t i = row_begin; i < row_end; ++i) {
      const scalar_t* p_i = p + i * h;
      const scalar_t* q_i = q + i * h;
      if (kUpdate) std::fill(acc.begin(), acc.end(), scalar_t(0));
      scalar_t row_sum = 0;
      for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
        const int64_t j = static_cast<int64_t>(col[k]);
        const scalar_t pi = dot(p_i, p + j * h, h);
        const scalar_t rho = dignn_sqrt(dist_sq(q_i, q + j * h, h));
        const scalar_t w_k = neural_edge_weight(a[k], pi, rho, eps);
        w[k] = w_k;
        row_sum += w_k;
        if (kUpdate) axpy(w_k, z + j * d, acc.data(), d);
      }
      kappa[i] = row_sum;
      if (kUpdate) {
        const RowCoefficients<scalar_t> rc = row_coefficients(chi[i], row_sum, inv_mu);
        finish_row(x + i * d, z + i * d, acc.data(), rc.cy, rc.ca, z_next + i * d, d,
                   local.diff_sq, local.out_sq);
      }
    }
    parts[chunk] = local;
  });
  return reduce_norms(parts);
}

template <typename scalar_t, typename index_t>
StepNorms cached_step_impl(const at::Tensor& rowptr_t, const at::Tensor& col_t,
                           const at::Tensor& w_t, const at::Tensor& b_t,
                           const at::Tensor& cy_t, const at::Tensor& rs_t,
                           const at::Tensor& cs_t, const at::Tensor& y_t,
                           at::Tensor& out_t) {
  const int64_t n = rowptr_t.numel() - 1;
  const int64_t d = y_t.size(1);
  const int64_t* rowptr = rowptr_t.data_ptr<int64_t>();
  const index_t* col = col_t.data_ptr<index_t>();
  const scalar_t* w = w_t.data_ptr<scalar_t>();
  const scalar_t* b = b_t.data_ptr<scalar_t>();
  const scalar_t* cy = cy_t.data_ptr<scalar_t>();
  const scalar_t* rs = rs_t.defined() ? rs_t.data_ptr<scalar_t>() : nullptr;
  const scalar_t* cs = cs_t.defined() ? cs_t.data_ptr<scalar_t>() : nullptr;
  const scalar_t* y = y_t.data_ptr<scalar_t>();
  scalar_t* out = out_t.data_ptr<scalar_t>();

  const RowChunks chunks = balanced_row_chunks(rowptr, n);
  std::vector<StepNorms> parts(chunks.size());
  parallel_for_rows(chunks, [&](int64_t chunk, int64_t row_begin, int64_t row_end) {
    std::vector<scalar_t> acc(d);
    StepNorms local;
    for (int64_t i = row_begin; i < row_end; ++i) {
      std::fill(acc.begin(), acc.end(), scalar_t(0));
      if (cs != nullptr) {
        for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
          const int64_t j = static_cast<int64_t>(col[k]);
          axpy(w[k] * cs[j], y + j * d, acc.data(), d);
        }
      } else {
        for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
          const int64_t j = static_cast<int64_t>(col[k]);
          axpy(w[k], y + j * d, acc.data(), d);
        }
      }
      const scalar_t scale = rs != nullptr ? rs[i] : scalar_t(1);
      finish_row(b + i * d, y + i * d, acc.data(), cy[i], scale, out + i * d, d,
                 local.diff_sq, local.out_sq);
    }
    parts[chunk] = local;
  });
  return reduce_norms(parts);
}

}  // namespace

StepNorms neural_edge_pass(const at::Tensor& rowptr, const at::Tensor& col,
                           const at::Tensor& a, const at::Tensor& p, const at::Tensor& q,
                           double eps, at::Tensor& w, at::Tensor& kappa,
                           const at::Tensor& chi, const at::Tensor& x, const at::Tensor& z,
                           double inv_mu, at::Tensor& z_next) {
  StepNorms norms;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "neural_edge_pass", [&] {
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "neural_edge_pass", [&] {
      if (z.defined()) {
        norms = neural_edge_pass_impl<scalar_t, index_t, true>(
            rowptr, col, a, p, q, eps, w, kappa, chi, x, z, inv_mu, z_next);
      } else {
        norms = neural_edge_pass_impl<scalar_t, index_t, false>(
            rowptr, col, a, p, q, eps, w, kappa, chi, x, z, inv_mu, z_next);
      }
    });
  });
  return norms;
}

StepNorms cached_step(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& w,
                      const at::Tensor& b, const at::Tensor& cy, const at::Tensor& rs,
                      const at::Tensor& cs, const at::Tensor& y, at::Tensor& out) {
  StepNorms norms;
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "cached_step", [&] {
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "cached_step", [&] {
      norms = cached_step_impl<scalar_t, index_t>(rowptr, col, w, b, cy, rs, cs, y, out);
    });
  });
  return norms;
}

}  // namespace cpu
}  // namespace dignn
