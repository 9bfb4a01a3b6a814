// Argument checks shared by the dignn ops. The Python layer validates user input with
// friendlier messages first; these keep direct callers of torch.ops.dignn.* from reaching
// a kernel with tensors it would read out of bounds.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Optional.h>

#include <string>

namespace dignn {

inline void check_csr(const at::Tensor& rowptr, const at::Tensor& col, const char* rowptr_name,
                      const char* col_name) {
  TORCH_CHECK(rowptr.dim() == 1 && rowptr.numel() >= 1, rowptr_name,
              " must be a 1-D tensor of n + 1 row offsets, got shape ", rowptr.sizes());
  TORCH_CHECK(rowptr.scalar_type() == at::kLong, rowptr_name, " must be int64, got ",
              rowptr.scalar_type());
  TORCH_CHECK(col.dim() == 1, col_name, " must be a 1-D tensor, got shape ", col.sizes());
  TORCH_CHECK(col.scalar_type() == at::kInt || col.scalar_type() == at::kLong, col_name,
              " must be int32 or int64, got ", col.scalar_type());
  TORCH_CHECK(col.device() == rowptr.device(), col_name, " is on ", col.device(), " but ",
              rowptr_name, " is on ", rowptr.device());
}

inline int64_t num_rows(const at::Tensor& rowptr) { return rowptr.numel() - 1; }

// A per-node (n x k) or per-edge (m) floating tensor on the graph's device.
inline void check_values(const at::Tensor& t, const char* name, at::IntArrayRef expected,
                         const at::Tensor& like, const at::Tensor& rowptr) {
  TORCH_CHECK(t.sizes() == expected, name, " must have shape ", expected, ", got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " must have dtype ",
              like.scalar_type(), " like the features, got ", t.scalar_type());
  TORCH_CHECK(t.device() == rowptr.device(), name, " is on ", t.device(),
              " but the graph is on ", rowptr.device());
}

inline void check_features(const at::Tensor& x, const char* name, int64_t n,
                           const at::Tensor& rowptr) {
  TORCH_CHECK(x.dim() == 2, name, " must be 2-D (nodes x channels), got shape ", x.sizes());
  TORCH_CHECK(x.size(0) == n, name, " has ", x.size(0), " rows but the graph has ", n,
              " nodes");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, name,
              " must be float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(x.device() == rowptr.device(), name, " is on ", x.device(),
              " but the graph is on ", rowptr.device());
}

inline void check_scalars(double mu, double eps) {
  TORCH_CHECK(mu > 0.0, "mu must be > 0, got ", mu);
  TORCH_CHECK(eps > 0.0, "eps must be > 0, got ", eps);
}

}  // namespace dignn
