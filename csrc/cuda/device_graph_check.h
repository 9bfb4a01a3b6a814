// The data checks of dignn::check_graph (check_graph_data, csrc/ops/checks.h) on GPU tensors
// (the CSR, its transpose and their consistency): the conditions as device ops, folded into
// one flag that is read back once; when it is set, the host version runs on copies to name the
// first bad entry, so the messages are the CPU op's.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <tuple>

#include "ops/checks.h"

namespace dignn {
namespace DIGNN_SIMT_NS {

// rowptr[0] != 0, a decreasing step, rowptr[-1] != m, or a col entry outside 0..n-1.
inline at::Tensor csr_data_bad(const at::Tensor& rowptr, const at::Tensor& col) {
  const int64_t n = num_rows(rowptr), m = col.numel();
  at::Tensor bad = rowptr.select(0, 0).ne(0).logical_or_(rowptr.select(0, n).ne(m));
  if (n > 0) bad.logical_or_(at::diff(rowptr).min().lt(0));
  if (m > 0) {
    const auto range = at::aminmax(col);
    bad.logical_or_(std::get<0>(range).lt(0)).logical_or_(std::get<1>(range).ge(n));
  }
  return bad;
}

// perm is not a permutation of 0..m-1: an entry out of range, or a position no entry hits
// (m entries in range that hit all m positions hit each once).
inline at::Tensor permutation_bad(const at::Tensor& perm) {
  const int64_t m = perm.numel();
  if (m == 0) return at::zeros({}, perm.options().dtype(at::kBool));
  const auto range = at::aminmax(perm);
  at::Tensor bad = std::get<0>(range).lt(0).logical_or_(std::get<1>(range).ge(m));
  at::Tensor hit = at::zeros({m}, perm.options().dtype(at::kBool));
  hit.index_fill_(0, perm.clamp(0, m - 1).to(at::kLong), true);
  return bad.logical_or_(hit.logical_not().any());
}

// (t_rowptr, t_col, t_perm) is not the transpose of (rowptr, col) (check_transpose_data): for
// entry k of the transposed CSR, in row j, CSR entry e = t_perm[k] must have col[e] == j and lie
// in row t_col[k]. Computed before the other conditions are known to hold, so every index is
// clamped into range (a garbage result then only adds to a flag already set by them).
inline at::Tensor transpose_bad(const at::Tensor& rowptr, const at::Tensor& col,
                                const Transposed& t) {
  const int64_t n = num_rows(rowptr), m = col.numel();
  if (n == 0 || m == 0 || t.col.numel() != m || t.perm.numel() != m) {
    return at::zeros({}, rowptr.options().dtype(at::kBool));
  }
  const at::Tensor k = at::arange(m, t.rowptr.options());
  // the row j of entry k: the last j with t_rowptr[j] <= k
  const at::Tensor j =
      at::searchsorted(t.rowptr, k, /*out_int32=*/false, /*right=*/true).sub_(1).clamp_(0, n - 1);
  const at::Tensor e = t.perm.to(at::kLong).clamp(0, m - 1);
  const at::Tensor i = t.col.to(at::kLong).clamp(0, n - 1);
  at::Tensor bad = col.index_select(0, e).to(at::kLong).ne(j);
  bad.logical_or_(e.lt(rowptr.index_select(0, i)))
      .logical_or_(e.ge(rowptr.index_select(0, i + 1)));
  return bad.any();
}

inline void check_graph_data_on_device(const at::Tensor& rowptr, const at::Tensor& col,
                                       const Transposed& t) {
  at::Tensor bad = csr_data_bad(rowptr, col);
  if (t.defined()) {
    bad.logical_or_(csr_data_bad(t.rowptr, t.col))
        .logical_or_(permutation_bad(t.perm))
        .logical_or_(transpose_bad(rowptr, col, t));
  }
  if (!bad.item<bool>()) return;  // the one read (a sync)
  const auto host = [](const at::Tensor& x) { return x.defined() ? x.cpu() : x; };
  check_graph_data(host(rowptr), host(col),
                   Transposed{host(t.rowptr), host(t.col), host(t.perm)});
  TORCH_CHECK(false, "check_graph: the device found a bad entry in the graph that the host "
              "check did not (please report this)");
}

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
