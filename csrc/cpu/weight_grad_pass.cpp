// CPU fused gradient pass: dl/dp and dl/dq of the neural edge weights (paper eq. 13-14),
// from the edge gradient G_ij. Math: csrc/dignn/laplacian_math.h ("Backward").
#include <ATen/Dispatch.h>

#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel_rows.h"
#include "dignn/laplacian_math.h"

namespace dignn {
namespace cpu {
namespace {

// Adds G * dW/dp_i and G * dW/dq_i of one edge between node i and node j to (gp, gq).
template <typename scalar_t>
inline void add_edge_grad(scalar_t a_k, scalar_t g_edge, const scalar_t* __restrict__ p_i,
                          const scalar_t* __restrict__ p_j,
                          const scalar_t* __restrict__ q_i,
                          const scalar_t* __restrict__ q_j, int64_t h, scalar_t eps,
                          scalar_t* __restrict__ gp, scalar_t* __restrict__ gq) {
  scalar_t pi = 0, rho_sq = 0;
#pragma omp simd reduction(+ : pi, rho_sq)
  for (int64_t c = 0; c < h; ++c) {
    pi += p_i[c] * p_j[c];
    const scalar_t t = q_i[c] - q_j[c];
    rho_sq += t * t;
  }
  const scalar_t rho = dignn_sqrt(rho_sq);
  const EdgeWeightPartials<scalar_t> e = neural_edge_weight_partials(a_k, pi, rho, eps);
  const scalar_t cp = g_edge * e.dw_dpi;
  // d rho / d q_i = (q_i - q_j) / rho, taken as 0 at rho = 0
  const scalar_t cq = rho > scalar_t(0) ? g_edge * e.dw_drho / rho : scalar_t(0);
#pragma omp simd
  for (int64_t c = 0; c < h; ++c) {
    gp[c] += cp * p_j[c];
    gq[c] += cq * (q_i[c] - q_j[c]);
  }
}

// (u_a - u_b) . (y_b - y_a) when `sym`, else u_a . (y_b - y_a)
template <typename scalar_t>
inline scalar_t edge_grad(const scalar_t* __restrict__ v_i, const scalar_t* __restrict__ v_j,
                          const scalar_t* __restrict__ z_i, const scalar_t* __restrict__ z_j,
                          int64_t d, bool sym) {
  scalar_t s = 0;
  if (sym) {
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < d; ++c) s += (v_i[c] - v_j[c]) * (z_j[c] - z_i[c]);
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < d; ++c) s += v_i[c] * (z_j[c] - z_i[c]);
  }
  return s;
}

template <typename scalar_t, typename index_t>
void weight_grad_impl(const at::Tensor& rowptr_t, const at::Tensor& col_t,
                      const at::Tensor& a_t, const at::Tensor& p_t, const at::Tensor& q_t,
                      double eps_d, const at::Tensor& z_t, const at::Tensor& v_t,
                      const at::Tensor& grad_w_t, const at::Tensor& t_rowptr_t,
                      const at::Tensor& t_col_t, const at::Tensor& t_a_t,
                      const at::Tensor& t_grad_w_t, at::Tensor& grad_p_t,
                      at::Tensor& grad_q_t) {
  const int64_t n = rowptr_t.numel() - 1;
  const int64_t h = p_t.size(1);
  const bool given = grad_w_t.defined();  // G per edge given, else from (v, z)
  const bool transposed = t_rowptr_t.defined();
  const int64_t d = given ? 0 : z_t.size(1);
  const int64_t* rowptr = rowptr_t.data_ptr<int64_t>();
  const index_t* col = col_t.data_ptr<index_t>();
  const scalar_t* a = a_t.data_ptr<scalar_t>();
  const scalar_t* p = p_t.data_ptr<scalar_t>();
  const scalar_t* q = q_t.data_ptr<scalar_t>();
  const scalar_t* z = given ? nullptr : z_t.data_ptr<scalar_t>();
  const scalar_t* v = given ? nullptr : v_t.data_ptr<scalar_t>();
  const scalar_t* gw = given ? grad_w_t.data_ptr<scalar_t>() : nullptr;
  const int64_t* t_rowptr = transposed ? t_rowptr_t.data_ptr<int64_t>() : nullptr;
  const index_t* t_col = transposed ? t_col_t.data_ptr<index_t>() : nullptr;
  const scalar_t* t_a = transposed ? t_a_t.data_ptr<scalar_t>() : nullptr;
  const scalar_t* t_gw = (transposed && given) ? t_grad_w_t.data_ptr<scalar_t>() : nullptr;
  scalar_t* grad_p = grad_p_t.data_ptr<scalar_t>();
  scalar_t* grad_q = grad_q_t.data_ptr<scalar_t>();
  const scalar_t eps = static_cast<scalar_t>(eps_d);

  // Balance on the heavier of the two CSR layouts' work; rows are independent.
  const RowChunks chunks = balanced_row_chunks(rowptr, n);
  parallel_for_rows(chunks, [&](int64_t, int64_t row_begin, int64_t row_end) {
    for (int64_t i = row_begin; i < row_end; ++i) {
      scalar_t* gp = grad_p + i * h;
      scalar_t* gq = grad_q + i * h;
      std::fill(gp, gp + h, scalar_t(0));
      std::fill(gq, gq + h, scalar_t(0));
      const scalar_t* p_i = p + i * h;
      const scalar_t* q_i = q + i * h;
      // Row i: edges (i, j), node i as first argument of W_ij. Without a transpose the
      // graph is symmetric and G_ij + G_ji is taken here at once.
      for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
        const int64_t j = static_cast<int64_t>(col[k]);
        const scalar_t g_edge =
            given ? gw[k] : edge_grad(v + i * d, v + j * d, z + i * d, z + j * d, d, !transposed);
        add_edge_grad(a[k], g_edge, p_i, p + j * h, q_i, q + j * h, h, eps, gp, gq);
      }
      if (!transposed) continue;
      // Transposed row i: edges (r, i), node i as second argument of W_ri.
      for (int64_t k = t_rowptr[i]; k < t_rowptr[i + 1]; ++k) {
        const int64_t r = static_cast<int64_t>(t_col[k]);
        const scalar_t g_edge =
            given ? t_gw[k] : edge_grad(v + r * d, v + r * d, z + r * d, z + i * d, d, false);
        add_edge_grad(t_a[k], g_edge, p_i, p + r * h, q_i, q + r * h, h, eps, gp, gq);
      }
    }
  });
}

}  // namespace

void neural_weight_grad_pass(const at::Tensor& rowptr, const at::Tensor& col,
                             const at::Tensor& a, const at::Tensor& p, const at::Tensor& q,
                             double eps, const at::Tensor& z, const at::Tensor& v,
                             const at::Tensor& grad_w, const at::Tensor& t_rowptr,
                             const at::Tensor& t_col, const at::Tensor& t_a,
                             const at::Tensor& t_grad_w, at::Tensor& grad_p,
                             at::Tensor& grad_q) {
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "neural_weight_grad", [&] {
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "neural_weight_grad", [&] {
      weight_grad_impl<scalar_t, index_t>(rowptr, col, a, p, q, eps, z, v, grad_w, t_rowptr,
                                          t_col, t_a, t_grad_w, grad_p, grad_q);
    });
  });
}

}  // namespace cpu
}  // namespace dignn
