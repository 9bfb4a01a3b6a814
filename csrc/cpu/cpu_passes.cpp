// The parts of the CPU's Passes that are not one kernel call (cpu_passes.h).
#include "cpu/cpu_passes.h"

#include <ATen/Dispatch.h>

#include <cmath>

#include "dignn/laplacian_math.h"

namespace dignn {
namespace cpu {

Residual::Residual(const at::Tensor& b, double tol) : tol_(tol) {
  // 16-bit b (a 16-bit solve's Y_1 as stored): squared in float32, as on the GPU
  const at::Tensor wide = is_storage16(b) ? b.to(at::kFloat) : b;
  norms_.diff_sq = norms_.out_sq = wide.square().sum(at::kDouble).item<double>();
}

bool Residual::stopped() const {
  const bool finite = std::isfinite(norms_.diff_sq) && std::isfinite(norms_.out_sq);
  return !finite || norms_.diff_sq <= tol_ * tol_ * norms_.out_sq;
}

at::Tensor Residual::stats() const {
  const double res = std::sqrt(norms_.diff_sq);
  const double rel = norms_.out_sq > 0.0 ? res / std::sqrt(norms_.out_sq) : 0.0;
  return at::tensor({static_cast<double>(iterations_), res, rel}, at::kDouble);
}

at::Tensor CpuPasses::row_sums(const at::Tensor& rowptr, const at::Tensor& values) const {
  const int64_t n = num_rows(rowptr);
  at::Tensor out = at::zeros({n}, values.options());
  if (values.numel() == 0) return out;
  at::Tensor counts = rowptr.narrow(0, 1, n) - rowptr.narrow(0, 0, n);
  at::Tensor rows = at::repeat_interleave(at::arange(n, rowptr.options()), counts);
  return out.index_add_(0, rows, values);
}

std::pair<at::Tensor, at::Tensor> CpuPasses::coefficients(const at::Tensor& chi,
                                                          const at::Tensor& kappa,
                                                          double inv_mu) const {
  at::Tensor cy = at::empty_like(chi);
  at::Tensor rs = at::empty_like(chi);
  AT_DISPATCH_FLOATING_TYPES(chi.scalar_type(), "row_coefficients", [&] {
    const scalar_t* c = chi.data_ptr<scalar_t>();
    const scalar_t* k = kappa.data_ptr<scalar_t>();
    scalar_t* y = cy.data_ptr<scalar_t>();
    scalar_t* a = rs.data_ptr<scalar_t>();
    const scalar_t im = static_cast<scalar_t>(inv_mu);
    int64_t bad = -1;  // a row whose coefficients overflow (finite chi, kappa, 1/mu)
    for (int64_t i = 0; i < chi.numel(); ++i) {
      const RowCoefficients<scalar_t> rc = row_coefficients(c[i], k[i], im);
      y[i] = rc.cy;
      a[i] = rc.rs;
      if (bad < 0 && std::isfinite(c[i]) && std::isfinite(k[i]) &&
          !(std::isfinite(rc.rs) && std::isfinite(rc.cy))) {
        bad = i;
      }
    }
    // Refused rather than turned into inf and NaN (dignn_kernels/laplacian.py
    // coefficient_overflow_message says the same for the Python passes).
    TORCH_CHECK_VALUE(bad < 0, "mu=", 1.0 / inv_mu, " is too small for these chi in ",
                      chi.scalar_type(), ": row ", bad, " has chi=",
                      bad >= 0 ? static_cast<double>(c[bad]) : 0.0, ", kappa=",
                      bad >= 0 ? static_cast<double>(k[bad]) : 0.0,
                      ", so its coefficients 1/(mu chi) and kappa/(mu chi) of "
                      "Z = X - (1/mu) Delta Z overflow. Compute in torch.float64, raise mu, or "
                      "raise the smallest chi.");
  });
  return {cy, rs};
}

}  // namespace cpu
}  // namespace dignn
