// The tensor-level CPU kernels of kernels.h: unpack the tensors and run the pass compiled for
// the widest instruction set this CPU has (override with DIGNN_CPU_ISA=generic|avx2|avx512).
#include <ATen/Dispatch.h>

#include <cstdlib>
#include <cstring>

#include "cpu/passes_common.h"
#include "ops/storage.h"

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
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
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

// Returns FN<TARGS>(args...) of the build for this CPU's instruction set; TARGS names the
// template arguments (a macro, see below).
#if DIGNN_CPU_MULTI_ISA
#define DIGNN_CALL_ISA(FN, TARGS, ...)              \
  switch (isa()) {                                  \
    case Isa::kAvx512:                              \
      return avx512::FN<TARGS>(__VA_ARGS__);        \
    case Isa::kAvx2:                                \
      return avx2::FN<TARGS>(__VA_ARGS__);          \
    default:                                        \
      return generic::FN<TARGS>(__VA_ARGS__);       \
  }
#else
#define DIGNN_CALL_ISA(FN, TARGS, ...) return generic::FN<TARGS>(__VA_ARGS__);
#endif
// The template arguments: compute dtype, index type (and storage of the iterates).
#define DIGNN_TARGS_WEIGHTS scalar_t, index_t
#define DIGNN_TARGS_STORED scalar_t, index_t, storage_t
#define DIGNN_TARGS_VALUE scalar_t
#define DIGNN_TARGS_STORED_OUT scalar_t, index_t, storage_t, out_t

template <typename T>
const T* ptr_or_null(const at::Tensor& t) {
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

StepNorms neural_edge_pass(const Csr& csr, const NeuralEdges& edges, at::Tensor& w,
                           at::Tensor& kappa, const NeuralStep* step, const Iterates* z) {
  const at::ScalarType compute = edges.a.scalar_type();
  const at::Tensor none;
  const at::Tensor& y = step != nullptr ? z->current : none;
  StepNorms norms;
  AT_DISPATCH_FLOATING_TYPES(compute, "neural_edge_pass", [&] {
    AT_DISPATCH_INDEX_TYPES(csr.col.scalar_type(), "neural_edge_pass", [&] {
      norms = [&]() -> StepNorms {
        DIGNN_CALL_ISA(neural_edge_pass_t, DIGNN_TARGS_WEIGHTS, csr.rowptr.data_ptr<int64_t>(),
                       csr.col.data_ptr<index_t>(), edges.a.data_ptr<scalar_t>(),
                       edges.p.data_ptr<scalar_t>(), edges.q.data_ptr<scalar_t>(),
                       csr.rowptr.numel() - 1, edges.p.size(1),
                       static_cast<scalar_t>(edges.eps), w.data_ptr<scalar_t>(),
                       kappa.data_ptr<scalar_t>(),
                       step != nullptr ? step->chi.data_ptr<scalar_t>() : nullptr,
                       step != nullptr ? step->b.data_ptr<scalar_t>() : nullptr,
                       ptr_or_null<scalar_t>(y), y.defined() ? y.size(1) : 0,
                       static_cast<scalar_t>(step != nullptr ? step->inv_mu : 0.0),
                       step != nullptr ? z->next.data_ptr<scalar_t>() : nullptr)
      }();
    });
  });
  return norms;
}

StepNorms row_pass(const Csr& csr, const RowMap& map, const at::Tensor& y,
                   const at::Tensor& out) {
  const at::ScalarType compute = map.w.scalar_type();
  StepNorms norms;
  const auto run = [&](auto compute_tag, auto storage_tag) {
    using scalar_t = decltype(compute_tag);
    using storage_t = decltype(storage_tag);
    const auto with_output = [&](auto out_tag) {
      using out_t = decltype(out_tag);
      AT_DISPATCH_INDEX_TYPES(csr.col.scalar_type(), "row_pass", [&] {
        norms = [&]() -> StepNorms {
          DIGNN_CALL_ISA(row_pass_t, DIGNN_TARGS_STORED_OUT, csr.rowptr.data_ptr<int64_t>(),
                         csr.col.data_ptr<index_t>(), map.w.data_ptr<scalar_t>(),
                         map.b.data_ptr<scalar_t>(), map.cy.data_ptr<scalar_t>(),
                         ptr_or_null<scalar_t>(map.rs), y.data_ptr<storage_t>(),
                         csr.rowptr.numel() - 1, y.size(1), out.data_ptr<out_t>())
        }();
      });
    };
    // out in y's dtype, or (the wide last iteration of a 16-bit solve) in the compute dtype
    if (out.scalar_type() == y.scalar_type()) {
      with_output(storage_t{});
    } else {
      with_output(scalar_t{});
    }
  };
  ops::dispatch_stored(compute, y.scalar_type(), "row_pass", run);
  return norms;
}

void neural_weight_grad(const Csr& csr, const Csr* t_csr, const NeuralEdges& edges,
                        const at::Tensor& t_a, const EdgeGradient& grad, at::Tensor& grad_p,
                        at::Tensor& grad_q) {
  const at::ScalarType compute = edges.a.scalar_type();
  const at::Tensor none;
  const at::Tensor& t_rowptr = t_csr != nullptr ? t_csr->rowptr : none;
  const at::Tensor& t_col = t_csr != nullptr ? t_csr->col : none;
  const auto run = [&](auto compute_tag, auto storage_tag) {
    using scalar_t = decltype(compute_tag);
    using storage_t = decltype(storage_tag);
    AT_DISPATCH_INDEX_TYPES(csr.col.scalar_type(), "neural_weight_grad", [&] {
      [&] {
        DIGNN_CALL_ISA(neural_weight_grad_t, DIGNN_TARGS_STORED,
                       csr.rowptr.data_ptr<int64_t>(), csr.col.data_ptr<index_t>(),
                       edges.a.data_ptr<scalar_t>(), edges.p.data_ptr<scalar_t>(),
                       edges.q.data_ptr<scalar_t>(), csr.rowptr.numel() - 1, edges.p.size(1),
                       static_cast<scalar_t>(edges.eps), ptr_or_null<storage_t>(grad.z),
                       ptr_or_null<storage_t>(grad.v), grad.z.defined() ? grad.z.size(1) : 0,
                       ptr_or_null<scalar_t>(grad.grad_w), ptr_or_null<int64_t>(t_rowptr),
                       ptr_or_null<index_t>(t_col), ptr_or_null<scalar_t>(t_a),
                       ptr_or_null<scalar_t>(grad.t_grad_w), grad_p.data_ptr<scalar_t>(),
                       grad_q.data_ptr<scalar_t>())
      }();
    });
  };
  // z and v in the compute dtype, or in one 16-bit dtype (csrc/ops/storage.h)
  ops::dispatch_stored(compute, grad.given() ? compute : grad.z.scalar_type(),
                       "neural_weight_grad", run);
}

void anderson_record(const at::Tensor& gy_new, const at::Tensor& y_new, const at::Tensor& f,
                     const at::Tensor& gy, const at::Tensor& f_new, const at::Tensor& d_f,
                     const at::Tensor& d_g, int64_t slot, int64_t count,
                     const at::Tensor& sums) {
  AT_DISPATCH_FLOATING_TYPES(gy_new.scalar_type(), "anderson_record", [&] {
    DIGNN_CALL_ISA(anderson_record_t, DIGNN_TARGS_VALUE, gy_new.data_ptr<scalar_t>(),
                   y_new.data_ptr<scalar_t>(), f.data_ptr<scalar_t>(), gy.data_ptr<scalar_t>(),
                   f_new.data_ptr<scalar_t>(), d_f.data_ptr<scalar_t>(),
                   d_g.data_ptr<scalar_t>(), gy_new.size(0), gy_new.size(1), slot, count,
                   sums.data_ptr<double>())
  });
}

}  // namespace cpu
}  // namespace dignn
