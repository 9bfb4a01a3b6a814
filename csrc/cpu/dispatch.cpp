// The tensor-level CPU kernels of kernels.h: unpack the tensors and run the pass compiled for
// the widest instruction set this CPU has (override with DIGNN_CPU_ISA=generic|avx2|avx512).
#include <ATen/Dispatch.h>

#include <cstdlib>
#include <cstring>

#include "cpu/passes_common.h"

namespace dignn {
namespace cpu {

namespace generic {
DIGNN_PASS_TEMPLATE_DECLS
}
#if DIGNN_CPU_MULTI_ISA
namespace avx2 {
DIGNN_PASS_TEMPLATE_DECLS
}
namespace avx512 {
DIGNN_PASS_TEMPLATE_DECLS
}
#endif

namespace {

enum class Isa { kGeneric, kAvx2, kAvx512 };

Isa detect_isa() {
#if DIGNN_CPU_MULTI_ISA
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
  const char* want = std::getenv("DIGNN_CPU_ISA");
  if (want != nullptr && *want != '\0') {
    if (std::strcmp(want, "generic") == 0) return Isa::kGeneric;
    if (std::strcmp(want, "avx2") == 0 && avx2) return Isa::kAvx2;
    if (std::strcmp(want, "avx512") == 0 && avx512) return Isa::kAvx512;
    TORCH_CHECK(false, "DIGNN_CPU_ISA=", want,
                " is not one of generic, avx2, avx512 that this CPU supports");
  }
  if (avx512) return Isa::kAvx512;
  if (avx2) return Isa::kAvx2;
#endif
  return Isa::kGeneric;
}

Isa isa() {
  static const Isa selected = detect_isa();
  return selected;
}

#if DIGNN_CPU_MULTI_ISA
#define DIGNN_CALL_ISA(FN, ...)                                 \
  switch (isa()) {                                              \
    case Isa::kAvx512:                                          \
      return avx512::FN<scalar_t, index_t>(__VA_ARGS__);        \
    case Isa::kAvx2:                                            \
      return avx2::FN<scalar_t, index_t>(__VA_ARGS__);          \
    default:                                                    \
      return generic::FN<scalar_t, index_t>(__VA_ARGS__);       \
  }
#else
#define DIGNN_CALL_ISA(FN, ...) return generic::FN<scalar_t, index_t>(__VA_ARGS__);
#endif

template <typename T>
const T* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

template <typename T>
T* mut_ptr_or_null(at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

}  // namespace

const char* isa_name() {
  switch (isa()) {
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx2:
      return "avx2";
    default:
      return "generic";
  }
}

StepNorms neural_edge_pass(const at::Tensor& rowptr, const at::Tensor& col,
                           const at::Tensor& a, const at::Tensor& p, const at::Tensor& q,
                           double eps, at::Tensor& w, at::Tensor& kappa,
                           const at::Tensor& chi, const at::Tensor& x, const at::Tensor& z,
                           double inv_mu, at::Tensor& z_next) {
  StepNorms norms;
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "neural_edge_pass", [&] {
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "neural_edge_pass", [&] {
      norms = [&]() -> StepNorms {
        DIGNN_CALL_ISA(neural_edge_pass_t, rowptr.data_ptr<int64_t>(),
                       col.data_ptr<index_t>(), a.data_ptr<scalar_t>(),
                       p.data_ptr<scalar_t>(), q.data_ptr<scalar_t>(), rowptr.numel() - 1,
                       p.size(1), static_cast<scalar_t>(eps), w.data_ptr<scalar_t>(),
                       kappa.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(chi),
                       ptr_or_null<scalar_t>(x), ptr_or_null<scalar_t>(z),
                       z.defined() ? z.size(1) : 0, static_cast<scalar_t>(inv_mu),
                       mut_ptr_or_null<scalar_t>(z_next))
      }();
    });
  });
  return norms;
}

StepNorms cached_step(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& w,
                      const at::Tensor& b, const at::Tensor& cy, const at::Tensor& rs,
                      const at::Tensor& y, at::Tensor& out) {
  StepNorms norms;
  AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "cached_step", [&] {
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "cached_step", [&] {
      norms = [&]() -> StepNorms {
        DIGNN_CALL_ISA(cached_step_t, rowptr.data_ptr<int64_t>(), col.data_ptr<index_t>(),
                       w.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(),
                       cy.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(rs),
                       y.data_ptr<scalar_t>(), rowptr.numel() - 1,
                       y.size(1), out.data_ptr<scalar_t>())
      }();
    });
  });
  return norms;
}

void neural_weight_grad_pass(const at::Tensor& rowptr, const at::Tensor& col,
                             const at::Tensor& a, const at::Tensor& p, const at::Tensor& q,
                             double eps, const at::Tensor& z, const at::Tensor& v,
                             const at::Tensor& grad_w, const at::Tensor& t_rowptr,
                             const at::Tensor& t_col, const at::Tensor& t_a,
                             const at::Tensor& t_grad_w, at::Tensor& grad_p,
                             at::Tensor& grad_q) {
  AT_DISPATCH_FLOATING_TYPES(p.scalar_type(), "neural_weight_grad", [&] {
    AT_DISPATCH_INDEX_TYPES(col.scalar_type(), "neural_weight_grad", [&] {
      [&] {
        DIGNN_CALL_ISA(weight_grad_t, rowptr.data_ptr<int64_t>(), col.data_ptr<index_t>(),
                       a.data_ptr<scalar_t>(), p.data_ptr<scalar_t>(),
                       q.data_ptr<scalar_t>(), rowptr.numel() - 1, p.size(1),
                       static_cast<scalar_t>(eps), ptr_or_null<scalar_t>(z),
                       ptr_or_null<scalar_t>(v), z.defined() ? z.size(1) : 0,
                       ptr_or_null<scalar_t>(grad_w), ptr_or_null<int64_t>(t_rowptr),
                       ptr_or_null<index_t>(t_col), ptr_or_null<scalar_t>(t_a),
                       ptr_or_null<scalar_t>(t_grad_w), grad_p.data_ptr<scalar_t>(),
                       grad_q.data_ptr<scalar_t>())
      }();
    });
  });
}

}  // namespace cpu
}  // namespace dignn
