// Argument checks of the dignn ops, called by the ops' code that every backend shares
// (csrc/ops/building_blocks.h, csrc/ops/solve.h; on the GPU also compiled for the kernels'
// host emulator), so a bad argument gets the same message everywhere.
//
// Two kinds:
// - shape, dtype and device checks, O(1): every op runs them first (check_*_args below), in
//   an order that blames the argument that is wrong (the CSR before the tensors sized by it);
// - data checks of a CSR, O(nodes + edges): rowptr starts at 0, never decreases and ends at
//   col.numel(), every col entry is a node index, t_perm is a permutation and (t_rowptr,
//   t_col, t_perm) is the transpose of (rowptr, col). Those are the
//   op dignn::check_graph (check_graph_data here holds its messages); the Python face
//   (dignn_kernels/ops.py) runs it before each op unless the caller passes trusted=True for a
//   graph it built itself (dignn_kernels/graph.py). The kernels index memory with these
//   values, so an op reached with a bad CSR and no check_graph reads out of bounds.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/util/Optional.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace dignn {

using OptTensor = c10::optional<at::Tensor>;

// ------------------------------------------------------------ shapes, dtypes, devices --

// A Tensor argument given None from Python arrives undefined: refused naming it (its shape
// would read as [0] and its device() throw without a name).
inline void check_defined(std::initializer_list<std::pair<const at::Tensor*, const char*>> args) {
  for (const auto& [t, name] : args) {
    TORCH_CHECK(t->defined(), name, " must be a tensor, got None");
  }
}

inline void check_csr(const at::Tensor& rowptr, const at::Tensor& col, const char* rowptr_name,
                      const char* col_name) {
  check_defined({{&rowptr, rowptr_name}, {&col, col_name}});
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

// 16-bit storage (a solve's storage_dtype; csrc/ops/storage.h): the iterates and projections
// the row and gradient passes and the neural edge weights read may be bfloat16 or float16; the
// edge values, coefficients and outputs other than the row pass's stay in the compute dtype.
inline bool is_storage16(at::ScalarType dtype) {
  return dtype == at::kBFloat16 || dtype == at::kHalf;
}
inline bool is_storage16(const at::Tensor& t) { return is_storage16(t.scalar_type()); }

// A 16-bit t where the op takes none (storage16 false): raises saying which ops take it.
inline void check_storage16_supported(const at::Tensor& t, const char* name, bool storage16) {
  TORCH_CHECK(storage16 || !is_storage16(t), name, " is ", t.scalar_type(),
              " but this op takes float32 or float64 (16-bit storage is taken by the row pass "
              "csr_fma, the gradient pass neural_weight_grad and neural_edge_weights); pass ",
              name, " in float32 or float64");
}

// The compute dtype of a pass that takes 16-bit storage: float32 or float64.
inline void check_compute_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, name,
              " must be float32 or float64 (the compute dtype; only iterates and projections may "
              "be stored in 16 bits), got ", t.scalar_type());
}

// A per-node (n x k) or per-edge (m) floating tensor on the graph's device, of like's dtype
// (storage_ok: or a 16-bit storage dtype).
inline void check_values(const at::Tensor& t, const char* name, at::IntArrayRef expected,
                         const at::Tensor& like, const at::Tensor& rowptr,
                         bool storage_ok = false) {
  TORCH_CHECK(t.sizes() == expected, name, " must have shape ", expected, ", got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == like.scalar_type() || (storage_ok && is_storage16(t)), name,
              " must have dtype ", like.scalar_type(), " like the features, got ",
              t.scalar_type());
  TORCH_CHECK(t.device() == rowptr.device(), name, " is on ", t.device(),
              " but the graph is on ", rowptr.device());
}

// The node signal that fixes n: a row count that differs from the CSR's is reported as the
// CSR's problem (a rowptr one entry short is the usual mistake), naming both.
inline void check_features(const at::Tensor& x, const char* name, int64_t n,
                           const at::Tensor& rowptr, bool storage_ok = false) {
  TORCH_CHECK(x.dim() == 2, name, " must be 2-D (nodes x channels), got shape ", x.sizes());
  TORCH_CHECK(x.size(0) == n, "rowptr has ", n, " + 1 entries for ", n, " rows but ", name,
              " has ", x.size(0), " rows (", name, " has ", x.size(0),
              " rows but the graph has ", n,
              " nodes): rowptr must hold num_nodes + 1 row offsets and ", name,
              " one row per node");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble ||
                  (storage_ok && is_storage16(x)),
              name, " must be float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(x.device() == rowptr.device(), name, " is on ", x.device(),
              " but the graph is on ", rowptr.device());
}

// A scalar that must be finite and > 0 (mu, eps): NaN fails the compare, and inf is refused
// too (eps = inf zeroes every neural weight, mu = inf every diffusion step, without an error).
inline void check_positive(double value, const char* name) {
  TORCH_CHECK(std::isfinite(value) && value > 0.0, name, " must be > 0 and finite, got ", value);
}

inline void check_scalars(double mu, double eps) {
  check_positive(mu, "mu");
  check_positive(eps, "eps");
}

inline void check_solve_scalars(double mu, double eps, int64_t max_iter, double tol) {
  check_scalars(mu, eps);
  TORCH_CHECK(max_iter >= 1, "max_iter must be >= 1, got ", max_iter);
  TORCH_CHECK(std::isfinite(tol) && tol >= 0.0, "tol must be >= 0 and finite, got ", tol);
}

using OptDtype = c10::optional<at::ScalarType>;

// A fused solve's storage_dtype (csrc/ops/solve.h): None, or bfloat16 / float16 iterates with
// float32 compute (x's dtype), the combination every backend's kernels take.
inline void check_solve_storage(const OptDtype& storage_dtype, const at::Tensor& x) {
  if (!storage_dtype.has_value()) return;
  TORCH_CHECK(is_storage16(*storage_dtype),
              "storage_dtype must be None (iterates in x's dtype), torch.bfloat16 or "
              "torch.float16, got ", *storage_dtype);
  TORCH_CHECK(x.scalar_type() == at::kFloat, "storage_dtype=", *storage_dtype,
              " needs float32 x (the dtype every sum runs in), got ", x.scalar_type(),
              ": pass x in float32, or storage_dtype=None (dignn_kernels.implicit_diffusion "
              "also stores float64 solves in 16 bits, in the solvers' loop over the passes)");
}

// The CSR and one value per edge; returns n.
inline int64_t check_graph_signal(const at::Tensor& rowptr, const at::Tensor& col,
                                  const at::Tensor& values, const char* values_name) {
  check_csr(rowptr, col, "rowptr", "col");
  TORCH_CHECK(values.dim() == 1 && values.numel() == col.numel(), values_name,
              " must hold one value per edge (col has ", col.numel(), " entries), got shape ",
              values.sizes());
  return num_rows(rowptr);
}

inline void check_projections(const at::Tensor& p, const at::Tensor& q, const at::Tensor& like,
                              int64_t n, const at::Tensor& rowptr) {
  check_features(p, "p", n, rowptr);
  check_values(q, "q", p.sizes(), like, rowptr);
  check_values(p, "p", q.sizes(), like, rowptr);
}

// The transposed CSR (t_rowptr, t_col) and t_perm: the graph's rows, edges and device.
inline void check_transposed(const at::Tensor& t_rowptr, const at::Tensor& t_col,
                             const at::Tensor& t_perm, const at::Tensor& rowptr,
                             const at::Tensor& col) {
  check_csr(t_rowptr, t_col, "t_rowptr", "t_col");
  TORCH_CHECK(t_rowptr.numel() == rowptr.numel(), "t_rowptr has ", t_rowptr.numel(),
              " entries but rowptr has ", rowptr.numel(),
              ": the transposed CSR has the graph's num_nodes + 1 row offsets");
  TORCH_CHECK(t_perm.dim() == 1 && (t_perm.scalar_type() == at::kLong ||
                                    t_perm.scalar_type() == at::kInt),
              "t_perm must be a 1-D int64 (or int32) tensor, got shape ", t_perm.sizes(),
              " and dtype ", t_perm.scalar_type());
  TORCH_CHECK(t_col.numel() == col.numel() && t_perm.numel() == col.numel(),
              "t_col and t_perm must hold one entry per edge (col has ", col.numel(),
              " entries), got ", t_col.numel(), " and ", t_perm.numel());
  TORCH_CHECK(t_rowptr.device() == rowptr.device() && t_perm.device() == rowptr.device(),
              "t_rowptr, t_col and t_perm must be on the graph's device ", rowptr.device());
}

struct Transposed {
  at::Tensor rowptr, col, perm;  // contiguous
  bool defined() const { return rowptr.defined(); }
};

// The optional transposed CSR: all three or none (undefined: a symmetric graph).
inline Transposed transposed_or_none(const OptTensor& t_rowptr, const OptTensor& t_col,
                                     const OptTensor& t_perm, const at::Tensor& rowptr,
                                     const at::Tensor& col) {
  const bool any = t_rowptr.has_value() || t_col.has_value() || t_perm.has_value();
  if (!any) return {};
  TORCH_CHECK(t_rowptr.has_value() && t_col.has_value() && t_perm.has_value(),
              "t_rowptr, t_col and t_perm go together: pass all three or none");
  check_transposed(*t_rowptr, *t_col, *t_perm, rowptr, col);
  return {t_rowptr->contiguous(), t_col->contiguous(), t_perm->contiguous()};
}

// ------------------------------------------------------------------ per op (O(1)) --
// Each returns n, the number of nodes.

// storage16: p and q may be stored in 16 bits (then a holds the compute dtype).
inline int64_t check_neural_edge_weights_args(const at::Tensor& rowptr, const at::Tensor& col,
                                              const at::Tensor& a, const at::Tensor& p,
                                              const at::Tensor& q, double eps,
                                              bool storage16 = false) {
  check_defined({{&a, "a"}, {&p, "p"}, {&q, "q"}});
  const int64_t n = check_graph_signal(rowptr, col, a, "a");
  check_storage16_supported(p, "p", storage16);
  check_features(p, "p", n, rowptr, storage16);
  check_values(q, "q", p.sizes(), p, rowptr);
  const at::Tensor& like = is_storage16(p) ? a : p;
  check_compute_dtype(like, "a");
  check_values(a, "a", {col.numel()}, like, rowptr);
  check_positive(eps, "eps");
  return n;
}

inline int64_t check_neural_edge_weights_backward_args(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a, const at::Tensor& p,
    const at::Tensor& q, double eps, const at::Tensor& grad_w, const at::Tensor& t_rowptr,
    const at::Tensor& t_col, const at::Tensor& t_perm) {
  check_defined({{&grad_w, "grad_w"}, {&t_rowptr, "t_rowptr"}, {&t_col, "t_col"},
                 {&t_perm, "t_perm"}});
  const int64_t n = check_neural_edge_weights_args(rowptr, col, a, p, q, eps);
  check_values(grad_w, "grad_w", {col.numel()}, p, rowptr);
  check_transposed(t_rowptr, t_col, t_perm, rowptr, col);
  return n;
}

inline int64_t check_diffusion_step_args(const at::Tensor& rowptr, const at::Tensor& col,
                                         const at::Tensor& w, const at::Tensor& chi,
                                         const at::Tensor& kappa, const at::Tensor& x,
                                         const at::Tensor& z, double mu) {
  check_defined({{&w, "w"}, {&chi, "chi"}, {&kappa, "kappa"}, {&x, "x"}, {&z, "z"}});
  const int64_t n = check_graph_signal(rowptr, col, w, "w");
  check_features(x, "x", n, rowptr);
  check_values(z, "z", x.sizes(), x, rowptr);
  check_values(chi, "chi", {n}, x, rowptr);
  check_values(kappa, "kappa", {n}, x, rowptr);
  check_values(w, "w", {col.numel()}, x, rowptr);
  check_positive(mu, "mu");
  return n;
}

// The graph with its edge values, and a signal y (n x d) that may be stored in 16 bits; sets
// n and returns what the other arguments' dtype must match: the values (the compute dtype)
// for a 16-bit y, else y.
inline const at::Tensor& check_stored_signal(const at::Tensor& rowptr, const at::Tensor& col,
                                             const at::Tensor& values, const char* values_name,
                                             const at::Tensor& y, const char* y_name,
                                             int64_t& n) {
  n = check_graph_signal(rowptr, col, values, values_name);
  check_features(y, y_name, n, rowptr, /*storage_ok=*/true);
  const at::Tensor& like = is_storage16(y) ? values : y;
  check_compute_dtype(like, values_name);
  return like;
}

// y (and b) may be stored in 16 bits (then w holds the compute dtype).
inline int64_t check_csr_fma_args(const at::Tensor& rowptr, const at::Tensor& col,
                                  const at::Tensor& w, const at::Tensor& y, const at::Tensor& b,
                                  const at::Tensor& cy, const at::Tensor& rs) {
  check_defined({{&w, "w"}, {&y, "y"}, {&b, "b"}, {&cy, "cy"}, {&rs, "rs"}});
  int64_t n;
  const at::Tensor& like = check_stored_signal(rowptr, col, w, "w", y, "y", n);
  check_values(b, "b", y.sizes(), like, rowptr, /*storage_ok=*/true);
  check_values(w, "w", {col.numel()}, like, rowptr);
  check_values(cy, "cy", {n}, like, rowptr);
  check_values(rs, "rs", {n}, like, rowptr);
  return n;
}

// row_product: the graph and the map (w, cy, rs) in one compute dtype (no 16-bit storage), y
// of that dtype, out a second contiguous buffer like y, done a float64 flag; returns n. (The
// schedule's shapes: Passes::check_schedule.)
inline int64_t check_row_product_args(const at::Tensor& rowptr, const at::Tensor& col,
                                      const at::Tensor& w, const at::Tensor& cy,
                                      const at::Tensor& rs, const at::Tensor& y,
                                      const at::Tensor& out, const at::Tensor& done) {
  check_defined({{&w, "w"}, {&cy, "cy"}, {&rs, "rs"}, {&y, "y"}, {&out, "out"},
                 {&done, "done"}});
  const int64_t n = check_graph_signal(rowptr, col, w, "w");
  check_compute_dtype(w, "w");
  check_values(w, "w", {col.numel()}, w, rowptr);
  // y's rows first: they fix n, so a rowptr of the wrong length is named here (with y), not
  // as a cy or rs of the wrong length
  TORCH_CHECK(y.dim() != 2 || y.size(0) == n, "rowptr has ", n, " + 1 entries for ", n,
              " rows but y has ", y.size(0), " rows (y must be a [", n, ", d] tensor of w's "
              "dtype): rowptr must hold num_nodes + 1 row offsets and y one row per node");
  check_values(cy, "cy", {n}, w, rowptr);
  check_values(rs, "rs", {n}, w, rowptr);
  TORCH_CHECK(y.dim() == 2 && y.size(0) == n && y.scalar_type() == w.scalar_type() &&
                  y.device() == rowptr.device(),
              "y must be a [", n, ", d] tensor of w's dtype ", w.scalar_type(), " on ",
              rowptr.device(), ", got ", y.sizes(), ", ", y.scalar_type(), ", ", y.device());
  TORCH_CHECK(out.sizes() == y.sizes() && out.scalar_type() == y.scalar_type() &&
                  out.device() == y.device() && out.is_contiguous(),
              "out must be a contiguous buffer like y (", y.sizes(), ", ", y.scalar_type(), ", ",
              y.device(), "), got ", out.sizes(), ", ", out.scalar_type(), ", ", out.device(),
              out.is_contiguous() ? "" : " (not contiguous)", ": pass torch.empty_like(y)");
  TORCH_CHECK(y.numel() == 0 || out.data_ptr() != y.data_ptr(),
              "out must not be y: the sweep reads y's neighbour rows while it writes out; pass "
              "a second buffer");
  TORCH_CHECK(done.numel() >= 1 && done.scalar_type() == at::kDouble &&
                  done.device() == y.device(),
              "done must be a float64 flag tensor on ", y.device(),
              " (its first element nonzero once the solve is done), got ", done.sizes(), ", ",
              done.scalar_type(), " on ", done.device());
  return n;
}

// z, v, p and q may be stored in 16 bits (then a holds the compute dtype, that of the
// gradients).
inline Transposed check_neural_weight_grad_args(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a, const at::Tensor& p,
    const at::Tensor& q, const at::Tensor& z, const at::Tensor& v, double eps,
    const OptTensor& t_rowptr, const OptTensor& t_col, const OptTensor& t_perm) {
  check_defined({{&a, "a"}, {&p, "p"}, {&q, "q"}, {&z, "z"}, {&v, "v"}});
  int64_t n;
  const at::Tensor& like = check_stored_signal(rowptr, col, a, "a", z, "z", n);
  check_values(v, "v", z.sizes(), like, rowptr, /*storage_ok=*/true);
  check_features(p, "p", n, rowptr, /*storage_ok=*/true);
  check_values(q, "q", p.sizes(), like, rowptr, /*storage_ok=*/true);
  check_values(p, "p", q.sizes(), like, rowptr, /*storage_ok=*/true);
  check_values(a, "a", {col.numel()}, like, rowptr);
  check_positive(eps, "eps");
  return transposed_or_none(t_rowptr, t_col, t_perm, rowptr, col);
}

// implicit_diffusion; returns whether the Laplacian is neural (p and q given).
inline bool check_implicit_diffusion_args(const at::Tensor& rowptr, const at::Tensor& col,
                                          const at::Tensor& edge_value, const at::Tensor& x,
                                          const at::Tensor& chi, const OptTensor& p,
                                          const OptTensor& q, const OptTensor& kappa,
                                          double mu, double eps, int64_t max_iter, double tol,
                                          const OptTensor& t_rowptr, const OptTensor& t_col,
                                          const OptTensor& t_perm,
                                          const OptDtype& storage_dtype) {
  check_defined({{&edge_value, "edge_value"}, {&x, "x"}, {&chi, "chi"}});
  const int64_t n = check_graph_signal(rowptr, col, edge_value, "edge_value");
  check_features(x, "x", n, rowptr);
  check_solve_storage(storage_dtype, x);
  transposed_or_none(t_rowptr, t_col, t_perm, rowptr, col);  // used by the backward
  check_values(chi, "chi", {n}, x, rowptr);
  check_values(edge_value, "edge_value", {col.numel()}, x, rowptr);
  check_solve_scalars(mu, eps, max_iter, tol);
  const bool neural = p.has_value() || q.has_value();
  TORCH_CHECK(!neural || (p.has_value() && q.has_value()),
              "p and q go together: pass both (neural Laplacian) or neither");
  TORCH_CHECK(!(neural && kappa.has_value()),
              "kappa is computed from the neural edge weights; pass it only for fixed W");
  if (neural) check_projections(*p, *q, x, n, rowptr);
  if (kappa.has_value()) check_values(*kappa, "kappa", {n}, x, rowptr);
  return neural;
}

inline Transposed check_implicit_diffusion_backward_args(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& edge_value,
    const at::Tensor& w, const at::Tensor& kappa, const OptTensor& t_rowptr,
    const OptTensor& t_col, const OptTensor& t_perm, const at::Tensor& x, const at::Tensor& chi,
    const OptTensor& p, const OptTensor& q, const at::Tensor& z, const at::Tensor& grad_z,
    double mu, double eps, int64_t max_iter, double tol, const OptDtype& storage_dtype) {
  check_defined({{&edge_value, "edge_value"}, {&w, "w"}, {&kappa, "kappa"}, {&x, "x"},
                 {&chi, "chi"}, {&z, "z"}, {&grad_z, "grad_z"}});
  const int64_t n = check_graph_signal(rowptr, col, edge_value, "edge_value");
  check_features(x, "x", n, rowptr);
  check_solve_storage(storage_dtype, x);
  const Transposed t = transposed_or_none(t_rowptr, t_col, t_perm, rowptr, col);
  check_values(z, "z", x.sizes(), x, rowptr);
  check_values(grad_z, "grad_z", x.sizes(), x, rowptr);
  check_values(chi, "chi", {n}, x, rowptr);
  check_values(kappa, "kappa", {n}, x, rowptr);
  check_values(w, "w", {col.numel()}, x, rowptr);
  check_values(edge_value, "edge_value", {col.numel()}, x, rowptr);
  check_solve_scalars(mu, eps, max_iter, tol);
  TORCH_CHECK(p.has_value() == q.has_value(),
              "p and q go together: pass both (neural Laplacian) or neither");
  if (p.has_value()) check_projections(*p, *q, x, n, rowptr);
  return t;
}

// Anderson's record (the op anderson_record, CPU): gy_new, y_new, f, gy one n x d signal, the
// window d_f, d_g m x n x d, all contiguous, of one dtype (float32 or float64), on the CPU;
// slot < count <= m.
inline void check_anderson_record_args(const at::Tensor& gy_new, const at::Tensor& y_new,
                                       const at::Tensor& f, const at::Tensor& gy,
                                       const at::Tensor& d_f, const at::Tensor& d_g,
                                       int64_t slot, int64_t count) {
  check_defined({{&gy_new, "gy_new"}, {&y_new, "y_new"}, {&f, "f"}, {&gy, "gy"}, {&d_f, "d_f"},
                 {&d_g, "d_g"}});
  TORCH_CHECK(gy_new.dim() == 2, "gy_new must be an n x d tensor, got shape ", gy_new.sizes());
  check_compute_dtype(gy_new, "gy_new");
  const std::pair<const at::Tensor*, const char*> signals[] = {
      {&gy_new, "gy_new"}, {&y_new, "y_new"}, {&f, "f"}, {&gy, "gy"}};
  for (const auto& [t, name] : signals) {
    TORCH_CHECK(t->sizes() == gy_new.sizes(), name, " must have gy_new's shape ",
                gy_new.sizes(), ", got ", t->sizes());
  }
  const int64_t n = gy_new.size(0), d = gy_new.size(1);
  const int64_t m = d_f.dim() == 3 ? d_f.size(0) : 0;
  TORCH_CHECK(d_f.dim() == 3 && m >= 1 && d_f.size(1) == n && d_f.size(2) == d,
              "d_f must be the window's m x n x d differences (m >= 1, n x d = ", gy_new.sizes(),
              "), got shape ", d_f.sizes());
  TORCH_CHECK(d_g.sizes() == d_f.sizes(), "d_g must have d_f's shape ", d_f.sizes(), ", got ",
              d_g.sizes());
  const std::pair<const at::Tensor*, const char*> all[] = {
      {&gy_new, "gy_new"}, {&y_new, "y_new"}, {&f, "f"}, {&gy, "gy"}, {&d_f, "d_f"},
      {&d_g, "d_g"}};
  for (const auto& [t, name] : all) {
    TORCH_CHECK(t->scalar_type() == gy_new.scalar_type(), name, " must have gy_new's dtype ",
                gy_new.scalar_type(), ", got ", t->scalar_type());
    TORCH_CHECK(t->device().is_cpu(), name, " is on ", t->device(),
                " but anderson_record runs on the CPU (a GPU solve takes the Triton record, "
                "dignn_kernels.solvers.anderson_update)");
    TORCH_CHECK(t->is_contiguous(), name, " must be contiguous (the record writes the window "
                "in place and reads rows by offset): pass ", name, ".contiguous()");
  }
  TORCH_CHECK(count >= 1 && count <= m, "count must be the filled slots, 1 <= count <= m = ", m,
              ", got ", count);
  TORCH_CHECK(slot >= 0 && slot < count, "slot must be one of the filled slots, 0 <= slot < "
              "count = ", count, ", got ", slot);
}

// ------------------------------------------------------------- data (O(n + m)) --

inline Transposed check_graph_args(const at::Tensor& rowptr, const at::Tensor& col,
                                   int64_t num_nodes, const OptTensor& t_rowptr,
                                   const OptTensor& t_col, const OptTensor& t_perm) {
  check_csr(rowptr, col, "rowptr", "col");
  TORCH_CHECK(num_nodes >= 0, "num_nodes must be >= 0, got ", num_nodes);
  TORCH_CHECK(num_rows(rowptr) == num_nodes, "rowptr has ", num_rows(rowptr), " + 1 entries for ",
              num_rows(rowptr), " rows but num_nodes = ", num_nodes,
              ": rowptr must hold num_nodes + 1 row offsets");
  return transposed_or_none(t_rowptr, t_col, t_perm, rowptr, col);
}

namespace detail {

template <typename index_t>
void check_csr_data(const int64_t* rp, const index_t* col, int64_t n, int64_t m,
                    const char* rp_name, const char* col_name) {
  TORCH_CHECK(rp[0] == 0, rp_name, "[0] = ", rp[0], " but must be 0: ", rp_name,
              "[i] is the position in ", col_name, " of row i's first entry");
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK(rp[i] <= rp[i + 1], rp_name, " must be non-decreasing (", rp_name, "[", i,
                "] = ", rp[i], " > ", rp_name, "[", i + 1, "] = ", rp[i + 1], ")");
  }
  TORCH_CHECK(rp[n] == m, rp_name, "[-1] = ", rp[n], " but ", col_name, " has ", m,
              " entries: ", rp_name, "[-1] must be the number of edges, ", col_name,
              ".numel()");
  for (int64_t k = 0; k < m; ++k) {
    // one unsigned compare tests 0 <= c < n
    if (static_cast<uint64_t>(col[k]) >= static_cast<uint64_t>(n)) {
      TORCH_CHECK(false, col_name, " holds node index ", static_cast<int64_t>(col[k]),
                  " at position ", k, ", outside 0..", n - 1, " (the graph has ", n, " nodes)");
    }
  }
}

template <typename index_t>
void check_permutation(const index_t* perm, int64_t m, const char* name) {
  std::vector<uint8_t> seen(static_cast<size_t>(m), 0);
  for (int64_t k = 0; k < m; ++k) {
    const int64_t e = static_cast<int64_t>(perm[k]);
    TORCH_CHECK(e >= 0 && e < m, name, " holds edge index ", e, " at position ", k,
                ", outside 0..", m - 1, " (the graph has ", m, " edges)");
    if (seen[e]) {
      int64_t first = 0;
      while (static_cast<int64_t>(perm[first]) != e) ++first;
      TORCH_CHECK(false, name, " must be a permutation of 0..", m - 1, ", but ", e,
                  " appears at positions ", first, " and ", k);
    }
    seen[e] = 1;
  }
}

// Entry k of the transposed CSR, in its row j, stands for the edge (t_col[k] -> j): t_perm[k]
// must be that edge's position e in the CSR, in row t_col[k] with col[e] == j. (A permutation
// that is not the transpose's would pair each edge with another edge's value: wrong gradients,
// no error.) All five arrays already passed check_csr_data and check_permutation, so every
// index read here is in range.
inline void check_transpose_data(const int64_t* rp, const int64_t* col, const int64_t* t_rp,
                                 const int64_t* t_col, const int64_t* perm, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t k = t_rp[j]; k < t_rp[j + 1]; ++k) {
      const int64_t e = perm[k], i = t_col[k];
      if (col[e] == j && rp[i] <= e && e < rp[i + 1]) continue;
      const int64_t r = std::upper_bound(rp, rp + n + 1, e) - rp - 1;  // e's row
      TORCH_CHECK(false, "t_perm[", k, "] = ", e, " but CSR entry ", e, " is (row ", r,
                  ", column ", col[e], "), while entry ", k, " of the transposed CSR (row ", j,
                  " of t_rowptr, t_col[", k, "] = ", i, ") stands for the CSR's (row ", i,
                  ", column ", j, "): t_rowptr, t_col and t_perm must be the transpose of "
                  "(rowptr, col); make them with dignn_kernels.graph.transpose_csr(rowptr, col, "
                  "num_nodes) or CSRGraph.transposed() of a graph from build_graph");
    }
  }
}

inline void check_csr_data(const at::Tensor& rowptr, const at::Tensor& col, const char* rp_name,
                           const char* col_name) {
  const at::Tensor rp = rowptr.contiguous(), cl = col.contiguous();
  AT_DISPATCH_INDEX_TYPES(cl.scalar_type(), "check_graph", [&] {
    check_csr_data<index_t>(rp.data_ptr<int64_t>(), cl.data_ptr<index_t>(), num_rows(rp),
                            cl.numel(), rp_name, col_name);
  });
}

}  // namespace detail

// The data checks of dignn::check_graph on CPU tensors (checked by check_graph_args); raises
// naming the first bad entry. The GPU op tests the same conditions on the device and, when
// one fails, runs this on host copies for the message.
inline void check_graph_data(const at::Tensor& rowptr, const at::Tensor& col,
                             const Transposed& t) {
  detail::check_csr_data(rowptr, col, "rowptr", "col");
  if (!t.defined()) return;
  detail::check_csr_data(t.rowptr, t.col, "t_rowptr", "t_col");
  const at::Tensor perm = t.perm.contiguous();
  AT_DISPATCH_INDEX_TYPES(perm.scalar_type(), "check_graph", [&] {
    detail::check_permutation<index_t>(perm.data_ptr<index_t>(), perm.numel(), "t_perm");
  });
  // int64 copies where the indices are int32: a once-per-call check, not a pass
  const auto wide = [](const at::Tensor& x) { return x.to(at::kLong).contiguous(); };
  const at::Tensor rp = wide(rowptr), cl = wide(col), t_rp = wide(t.rowptr), t_cl = wide(t.col),
                   pm = wide(perm);
  detail::check_transpose_data(rp.data_ptr<int64_t>(), cl.data_ptr<int64_t>(),
                               t_rp.data_ptr<int64_t>(), t_cl.data_ptr<int64_t>(),
                               pm.data_ptr<int64_t>(), num_rows(rp));
}

}  // namespace dignn
