// The math of every dignn kernel, in one place.
//
// Paper: "Dirichlet Implicit Graph Neural Networks" (../shared/paper/dignn-paper.tex),
// section 4.1 (graph neural Laplacian, eq. 12-14), eq. 6 (parameterized Laplacian),
// the well-posedness corollary (the iteration, eq. 19) and appendix "Training for DIGNNs".
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
//   (Delta Z)_i    = (1/chi_i) sum_j W_ij (z_i - z_j) = (kappa_i z_i - (W Z)_i) / chi_i  (eq. 6)
// The canonical Laplacians (the paper's appendix) are the same form with fixed (W, chi, kappa):
//   rw: W = a, chi = D, kappa = D;  unnormalized: W = a, chi = 1, kappa = D;
//   sym: W_ij = a_ij / sqrt(D_i D_j), chi = 1, kappa = 1 (kappa = 0 where D_i = 0).
//
// Forward fixed point (eq. iter), Z_0 = 0:
//   Z_{t+1} = X - (1/mu) Delta Z_t,  row by row:
//   z_i <- x_i + cy_i z_i + rs_i (W Z)_i,  rs_i = 1/(mu chi_i),  cy_i = -kappa_i rs_i.
// Guard: a row with chi_i <= kChiFloor (chi_i = 0 happens for an all-zero feature row or an
// isolated node) has no mass in the vertex Hilbert space; 0/0 is taken as 0, so the row does
// not diffuse: rs_i = cy_i = 0 and z_i = x_i. For the neural Laplacian chi_i = 0 already
// forces W_ij = 0 on the whole row (p_i = 0 gives phi_ij = 0), so the guard only fixes 0/0.
//
// Backward by implicit differentiation (appendix "Training for DIGNNs"): with
// F(Z) = X + cy.Z + rs.(W Z), the adjoint u = dl/dX solves u = g + (dF/dZ)^T u, i.e.
//   u <- g + cy.u + W^T (rs.u)           (the paper's u = g - (1/mu) Delta^T u)
// iterated from u_0 = 0 with the same kind of CSR pass (on W^T, which is W itself when the
// graph is symmetric). Then, with v = rs.u:
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

// Always inlined: the CPU's SIMD passes instantiate these templates on vector types from code
// compiled for a wider instruction set than the template's own definition (see
// csrc/cpu/passes_impl.h); inlined, they take the caller's.
#if defined(__CUDACC__) || defined(__HIPCC__)
#define DIGNN_HOST_DEVICE __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define DIGNN_HOST_DEVICE inline __attribute__((always_inline))
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

// ------------------------------------------------------- the neural edge weight --
// The formulas below are written once for any value type V with + - * / and comparisons:
// float or double (the scalar code of every backend), or a GCC vector of them (the CPU's
// SIMD passes, which bring their own tanh, csrc/cpu/passes_impl.h). Zero is V{}. Arguments
// are references: GCC would warn that a wide vector passed by value changes the ABI.

// s_ij = 1 / (rho_ij + eps), the argument of eq. 14's tanh.
template <typename V, typename S>
DIGNN_HOST_DEVICE V inverse_distance(const V& rho, S eps) {
  return 1 / (rho + eps);
}

// W_ij = varphi_ij^2 phi_ij = a_ij tanh(s_ij) tanh(|pi_ij|)   (eq. 13, 14) from its factors
// t = tanh(s_ij) (varphi_ij^2 = a_ij t) and phi = tanh(|pi_ij|).
template <typename V>
DIGNN_HOST_DEVICE V edge_weight(const V& a, const V& t, const V& phi) {
  return a * t * phi;
}

template <typename T>
DIGNN_HOST_DEVICE T neural_edge_weight(T a, T pi, T rho, T eps) {
  return edge_weight(a, dignn_tanh(inverse_distance(rho, eps)), dignn_tanh(dignn_abs(pi)));
}

// The tanh factors of an edge's weight with 1 - tanh^2 of each, for its derivatives.
template <typename V>
struct EdgeTanhFactors {
  V s;       // 1 / (rho + eps)
  V t;       // tanh(s)
  V t_s2;    // 1 - t^2
  V phi;     // tanh(|pi|)
  V phi_s2;  // 1 - phi^2
};

// The per-edge scalars of the gradient pass from G = dl/dW_ij (appendix "Training for
// DIGNNs"): cp = G dW/dpi, the coefficient of p_j in dl/dp_i, and cq = G (dW/drho) / rho, that
// of (q_i - q_j) in dl/dq_i (0 at rho = 0), with
//   dW/dpi  = a tanh(s) (1 - phi^2) sign(pi)
//   dW/drho = -a phi (1 - tanh(s)^2) s^2        (ds/drho = -s^2).
template <typename V>
struct EdgeGradScalars {
  V cp;
  V cq;
};

template <typename V>
DIGNN_HOST_DEVICE EdgeGradScalars<V> edge_grad_scalars(const V& a, const V& g, const V& pi,
                                                       const V& rho,
                                                       const EdgeTanhFactors<V>& f) {
  const V zero{};
  const V sign = pi > zero ? zero + 1 : (pi < zero ? zero - 1 : zero);
  const V dw_dpi = a * f.t * f.phi_s2 * sign;
  const V dw_drho = -a * f.phi * f.t_s2 * f.s * f.s;
  // (rho > 0 ? rho : 1): no division by zero in the lanes of a vector that are dropped
  return {g * dw_dpi, rho > zero ? g * dw_drho / (rho > zero ? rho : zero + 1) : zero};
}

template <typename T>
DIGNN_HOST_DEVICE EdgeGradScalars<T> neural_edge_grad_scalars(T a, T g, T pi, T rho, T eps) {
  EdgeTanhFactors<T> f;
  f.s = inverse_distance(rho, eps);
  tanh_sech2(f.s, f.t, f.t_s2);
  tanh_sech2(dignn_abs(pi), f.phi, f.phi_s2);
  return edge_grad_scalars(a, g, pi, rho, f);
}

// ---------------------------------------------------------- the fixed-point map --

// Row coefficients of the fixed-point map: z_i <- x_i + cy z_i + rs (W Z)_i.
template <typename T>
struct RowCoefficients {
  T cy;  // -kappa_i / (mu chi_i)
  T rs;  //  1 / (mu chi_i)
};

template <typename T>
DIGNN_HOST_DEVICE RowCoefficients<T> row_coefficients(T chi, T kappa, T inv_mu) {
  RowCoefficients<T> c;
  if (chi > T(kChiFloor)) {
    c.rs = inv_mu / chi;
    c.cy = -kappa * c.rs;
  } else {  // guard: 0/0 := 0, the row keeps z_i = x_i
    c.rs = T(0);
    c.cy = T(0);
  }
  return c;
}

}  // namespace dignn
