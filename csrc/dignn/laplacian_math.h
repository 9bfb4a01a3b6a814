// The math of every dignn kernel, in one place.
//
// Paper: "Dirichlet Implicit Graph Neural Networks" (../shared/paper/dignn-paper.tex),
// section 4.1 (graph neural Laplacian, eq. 12-14), eq. 9 (parameterized Laplacian),
// corollary 4.3 (the fixed-point iteration, eq. iter) and appendix "Training for DIGNNs".
//
// A graph is a CSR matrix of non-negative edge values a_ij: row i lists the nodes j
// that node i aggregates from (PyG's target-row convention, see dignn_kernels/graph.py).
//
// Node projections (dense GEMMs done once per forward, outside the kernels):
//   c = X Θχ^T,  p = c Θφ^T = Θφ Θχ x,  q = X Θϕ^T,   all n x h.
//
// Graph neural Laplacian (eq. 12-14):
//   chi_i          = D_i tanh(||c_i||),                 D_i = sum_j a_ij        (eq. 12)
//   phi_ij         = tanh(|pi_ij|),                     pi_ij = p_i . p_j       (eq. 13)
//   varphi_ij^2    = a_ij tanh(1 / (rho_ij + eps)),     rho_ij = ||q_i - q_j||  (eq. 14)
//   W_ij           = varphi_ij^2 phi_ij                 (edge weight, symmetric when a is)
//   kappa_i        = sum_j W_ij                         (row sum)
//   (Delta Z)_i    = (1/chi_i) sum_j W_ij (z_i - z_j) = (kappa_i z_i - (W Z)_i) / chi_i  (eq. 9)
// The canonical Laplacians (appendix table 1) are the same form with fixed (W, chi, kappa):
//   rw: W = a, chi = D, kappa = D;  unnormalized: W = a, chi = 1, kappa = D;
//   sym: W_ij = a_ij / sqrt(D_i D_j), chi = 1, kappa = 1 (kappa = 0 where D_i = 0).
//
// Forward fixed point (eq. iter), Z_0 = 0:
//   Z_{t+1} = X - (1/mu) Delta Z_t,  row by row:
//   z_i <- x_i + cy_i z_i + ca_i (W Z)_i,  ca_i = 1/(mu chi_i),  cy_i = -kappa_i ca_i.
// Guard: a row with chi_i <= kChiFloor (chi_i = 0 happens for an all-zero feature row or an
// isolated node) has no mass in the vertex Hilbert space; 0/0 is taken as 0, so the row does
// not diffuse: ca_i = cy_i = 0 and z_i = x_i. For the neural Laplacian chi_i = 0 already
// forces W_ij = 0 on the whole row (p_i = 0 gives phi_ij = 0), so the guard only fixes 0/0.
//
// Backward by implicit differentiation (appendix "Training for DIGNNs"): with
// F(Z) = X + cy.Z + ca.(W Z), the adjoint u = dl/dX solves u = g + (dF/dZ)^T u, i.e.
//   u <- g + cy.u + W^T (ca.u)           (the paper's u = g - (1/mu) Delta^T u)
// iterated from u_0 = 0 with the same kind of CSR pass (on W^T, which is W itself when the
// graph is symmetric). Then, with v = ca.u:
//   dl/dx_i     = u_i
//   dl/dchi_i   = u_i . (x_i - z_i) / chi_i        (0 on guarded rows)
//   dl/dW_ij    = G_ij = v_i . (z_j - z_i)
//   dl/dp_i     = sum_{(i,j)} G_ij dW_ij/dpi_ij p_j + sum_{(j,i)} G_ji dW_ji/dpi_ji p_j
//   dl/dq_i     = sum_{(i,j)} G_ij dW_ij/drho_ij (q_i - q_j)/rho_ij + (same over (j,i))
// On a symmetric graph W_ji = W_ij, so both sums run over row i with
//   G_ij + G_ji = (v_i - v_j) . (z_j - z_i):
// every row's gradient is formed inside its own row (no atomics, bit-for-bit deterministic).
// Sub-gradients at the kinks: d|pi|/dpi = 0 at pi = 0, d rho/dq = 0 at rho = 0, d||c||/dc = 0 at c = 0.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DIGNN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DIGNN_HOST_DEVICE inline
#endif

namespace dignn {

// Rows with chi at or below this floor are guarded (see above). Large enough that
// 1/chi never overflows float32, small enough never to touch a real row.
constexpr double kChiFloor = 1e-30;

DIGNN_HOST_DEVICE float dignn_tanh(float x) { return ::tanhf(x); }
DIGNN_HOST_DEVICE double dignn_tanh(double x) { return ::tanh(x); }
DIGNN_HOST_DEVICE float dignn_sqrt(float x) { return ::sqrtf(x); }
DIGNN_HOST_DEVICE double dignn_sqrt(double x) { return ::sqrt(x); }
DIGNN_HOST_DEVICE float dignn_abs(float x) { return ::fabsf(x); }
DIGNN_HOST_DEVICE double dignn_abs(double x) { return ::fabs(x); }

DIGNN_HOST_DEVICE float dignn_exp(float x) { return ::expf(x); }
DIGNN_HOST_DEVICE double dignn_exp(double x) { return ::exp(x); }
DIGNN_HOST_DEVICE float dignn_expm1(float x) { return ::expm1f(x); }
DIGNN_HOST_DEVICE double dignn_expm1(double x) { return ::expm1(x); }

// t = tanh(x) and s2 = 1 - tanh(x)^2 for x >= 0, both to full relative precision (1 - t*t
// would lose every digit of s2 once t rounds to 1): with e = exp(-2x),
// t = -expm1(-2x) / (2 + expm1(-2x)) and s2 = 4 e / (1 + e)^2.
template <typename T>
DIGNN_HOST_DEVICE void tanh_sech2(T x, T& t, T& s2) {
  const T em = dignn_expm1(T(-2) * x);
  const T e = dignn_exp(T(-2) * x);
  t = -em / (T(2) + em);
  s2 = T(4) * e / ((T(1) + e) * (T(1) + e));
}

// W_ij = a_ij tanh(1/(rho + eps)) tanh(|pi|)   (eq. 13, 14)
template <typename T>
DIGNN_HOST_DEVICE T neural_edge_weight(T a, T pi, T rho, T eps) {
  return a * dignn_tanh(T(1) / (rho + eps)) * dignn_tanh(dignn_abs(pi));
}

template <typename T>
struct EdgeWeightPartials {
  T w;        // W_ij
  T dw_dpi;   // dW/dpi   = a tanh(1/(rho+eps)) (1 - phi^2) sign(pi)
  T dw_drho;  // dW/drho  = -a phi (1 - t^2) / (rho + eps)^2,  t = tanh(1/(rho+eps))
};

template <typename T>
DIGNN_HOST_DEVICE EdgeWeightPartials<T> neural_edge_weight_partials(T a, T pi, T rho,
                                                                    T eps) {
  const T s = T(1) / (rho + eps);
  T t, t_s2, phi, phi_s2;  // tanh and 1 - tanh^2 of s and of |pi|
  tanh_sech2(s, t, t_s2);
  tanh_sech2(dignn_abs(pi), phi, phi_s2);
  const T sign = pi > T(0) ? T(1) : (pi < T(0) ? T(-1) : T(0));
  EdgeWeightPartials<T> out;
  out.w = a * t * phi;
  out.dw_dpi = a * t * phi_s2 * sign;
  out.dw_drho = -a * phi * t_s2 * s * s;
  return out;
}

// Row coefficients of the fixed-point map: z_i <- x_i + cy z_i + ca (W Z)_i.
template <typename T>
struct RowCoefficients {
  T cy;  // -kappa_i / (mu chi_i)
  T ca;  //  1 / (mu chi_i)
};

template <typename T>
DIGNN_HOST_DEVICE RowCoefficients<T> row_coefficients(T chi, T kappa, T inv_mu) {
  RowCoefficients<T> c;
  if (chi > T(kChiFloor)) {
    c.ca = inv_mu / chi;
    c.cy = -kappa * c.ca;
  } else {  // guard: 0/0 := 0, the row keeps z_i = x_i
    c.ca = T(0);
    c.cy = T(0);
  }
  return c;
}

}  // namespace dignn
