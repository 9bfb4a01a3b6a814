// 16-bit storage (a solve's storage_dtype, dignn_kernels/solvers/op.py), written once for every
// backend: which tensors a backend's kernels read in bfloat16 or float16, and which the ops widen
// to the compute dtype before calling them.
//
// The kernels (a Passes class, csrc/ops/passes.h) take 16 bits in two places only, both with
// float32 compute: the row pass's iterates y and out, and the gradient pass's z and v (both in
// the same 16-bit dtype). They widen every such load exactly and sum in float32; the row pass
// rounds its output to nearest even on the store, as torch's .to(dtype) does, and a solve's
// step norms are of that rounded output (the iterate as stored). Everything else
// reaches them in the compute dtype (that of the edge values):
// - b, p and q are widened once per pass (exact). b is read once per row, not gathered; p and q
//   are gathered, but the edge weights' derivatives are sensitive to their rounding and a solve
//   keeps them in the compute dtype (op.py).
// - float64 compute with 16-bit iterates: the float64 pass on y widened, its output rounded by
//   torch (the values of a pass that widens every load; no float64 kernels take 16 bits).
// - z and v of different dtypes, or with float64 compute: widened.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include "ops/checks.h"
#include "ops/passes.h"

namespace dignn {
namespace ops {

// t in the compute dtype: widened (exactly) from 16-bit storage, else t itself.
inline at::Tensor widened(const at::Tensor& t, at::ScalarType compute) {
  return t.defined() && t.scalar_type() != compute ? t.to(compute) : t;
}

// The neural edges with p and q in the compute dtype (a's).
inline NeuralEdges with_compute_projections(const NeuralEdges& e) {
  const at::ScalarType compute = e.a.scalar_type();
  return {e.a, widened(e.p, compute), widened(e.q, compute), e.eps};
}

// out = b + cy.y + rs.(W y) with y and out stored in out's dtype (16 bits or the compute dtype,
// w's): the backend's row pass, given b in the compute dtype and 16-bit iterates only with
// float32 compute.
template <typename Passes>
void stored_row_pass(const Passes& passes, const typename Passes::Csr& csr, const RowMap& map,
                     const at::Tensor& y, const at::Tensor& out) {
  const at::ScalarType compute = map.w.scalar_type();
  const RowMap m{map.w, widened(map.b, compute), map.cy, map.rs};
  if (!is_storage16(y) || compute == at::kFloat) {
    passes.row_pass(csr, m, y, out);
    return;
  }
  at::Tensor wide = at::empty(out.sizes(), out.options().dtype(compute));
  passes.row_pass(csr, m, y.to(compute), wide);
  out.copy_(wide);
}

// dl/dW formed from z and v as the gradient pass takes them: both in one 16-bit dtype with
// float32 compute, else both in the compute dtype.
inline EdgeGradient stored_edge_gradient(const EdgeGradient& grad, at::ScalarType compute) {
  if (grad.given()) return grad;
  const bool stored = compute == at::kFloat && is_storage16(grad.z) &&
                      grad.v.scalar_type() == grad.z.scalar_type();
  if (stored) return grad;
  return EdgeGradient::from_adjoint(widened(grad.z, compute), widened(grad.v, compute));
}

// Calls fn(compute_tag, storage_tag), default-constructed values of the C++ types of a pass's
// compute dtype and of the dtype its iterates are stored in: (float or double, the same), or
// (float, c10::BFloat16 or c10::Half). The kernels' dispatch, for every backend; `name` (the
// pass) goes into the error of a combination that storage.h never hands on.
template <typename Fn>
void dispatch_stored(at::ScalarType compute, at::ScalarType storage, const char* name,
                     const Fn& fn) {
  if (storage == compute) {
    AT_DISPATCH_FLOATING_TYPES(compute, "dispatch_stored",
                               [&] { fn(scalar_t{}, scalar_t{}); });
    return;
  }
  TORCH_INTERNAL_ASSERT(compute == at::kFloat, name, ": ", storage, " iterates with ", compute,
                        " compute (csrc/ops/storage.h widens them first)");
  AT_DISPATCH_REDUCED_FLOATING_TYPES(storage, "dispatch_stored",
                                     [&] { fn(float{}, scalar_t{}); });
}

}  // namespace ops
}  // namespace dignn
