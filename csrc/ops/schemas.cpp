// The dignn operator library: one schema per op. Each op's code is written once
// (csrc/ops/solve.h, csrc/ops/building_blocks.h) and registered per device over that
// backend's passes (csrc/cpu/ops_cpu.cpp, csrc/cuda/ops_cuda.cpp). Fake (meta) kernels and
// the autograd formula of neural_edge_weights are registered from dignn_kernels/ops.py.
// implicit_diffusion and implicit_diffusion_backward are the compiled backends' fused solve:
// they are differentiated through the one solve op of the Python package
// (dignn::implicit_solve, dignn_kernels/solvers/op.py), which runs them. The other ops are
// building blocks and passes of a backward, with no autograd formula of their own.
//
// Conventions (math in csrc/dignn/laplacian_math.h):
//   rowptr int64 [n+1], col int32|int64 [m]: CSR of the edge values a (or weights W);
//   x, z, g, u: n x d node signals; p, q: n x h node projections; chi, kappa: n;
//   t_rowptr, t_col, t_perm: the transposed CSR and, for each of its entries, the position
//   of the same edge in the CSR (omitted for symmetric graphs).
#include <torch/library.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>

TORCH_LIBRARY(dignn, m) {
  // W_k = a_k tanh(1/(||q_i - q_j|| + eps)) tanh(|p_i . p_j|) and kappa_i = sum_k W_k.
  m.def("neural_edge_weights(Tensor rowptr, Tensor col, Tensor a, Tensor p, Tensor q, "
        "float eps) -> (Tensor w, Tensor kappa)");
  // dl/dp, dl/dq from dl/dW (per edge); needs the transposed CSR.
  m.def("neural_edge_weights_backward(Tensor rowptr, Tensor col, Tensor a, Tensor p, "
        "Tensor q, float eps, Tensor grad_w, Tensor t_rowptr, Tensor t_col, Tensor t_perm) "
        "-> (Tensor grad_p, Tensor grad_q)");
  // Cached-weight forward pass: z_next = x - (1/mu) Delta z.
  m.def("diffusion_step(Tensor rowptr, Tensor col, Tensor w, Tensor chi, Tensor kappa, "
        "Tensor x, Tensor z, float mu) -> Tensor");
  // The general row pass under the step above and the adjoint: out = b + cy * y + rs * (W y), with
  // cy and rs per row (any linear fixed-point or Krylov iteration on the Laplacian); on the
  // graph's csr_schedule when given (a solve's sweeps), else on one made in the call.
  m.def("csr_fma(Tensor rowptr, Tensor col, Tensor w, Tensor y, Tensor b, Tensor cy, "
        "Tensor rs, Tensor[]? schedule=None) -> Tensor");
  // The work schedule of a CSR as the kernels of the tensors' device read it (csrc/ops/
  // building_blocks.h; none on the CPU), made once for the ops that take it.
  m.def("csr_schedule(Tensor rowptr, Tensor col) -> Tensor[]");
  // cg's sweep with its dot products: out = cy * y + rs * (W y) and dots = the sum over rows
  // of out * y per channel, on the graph's csr_schedule; nothing written (dots 0) once the
  // float64 flag done[0] is nonzero.
  m.def("row_product(Tensor rowptr, Tensor col, Tensor w, Tensor cy, Tensor rs, "
        "Tensor[] schedule, Tensor y, Tensor(a!) out, Tensor done) -> Tensor");
  // Fused gradient pass: dl/dp, dl/dq from the adjoint v and the equilibrium z,
  // with G_ij = v_i . (z_j - z_i).
  m.def("neural_weight_grad(Tensor rowptr, Tensor col, Tensor a, Tensor p, Tensor q, "
        "Tensor z, Tensor v, float eps, Tensor? t_rowptr=None, Tensor? t_col=None, "
        "Tensor? t_perm=None) -> (Tensor grad_p, Tensor grad_q)");
  // The O(nodes + edges) data checks of a CSR (csrc/ops/checks.h): rowptr[0] == 0, rowptr
  // non-decreasing, rowptr[-1] == col.numel(), 0 <= col < num_nodes; the same for the
  // transposed CSR, and t_perm a permutation of 0..m-1. Raises naming the first bad entry.
  // The other ops check shapes, dtypes and devices only; dignn_kernels.ops runs this before
  // them unless told the graph is trusted. The GPU version reads one flag back (it syncs).
  m.def("check_graph(Tensor rowptr, Tensor col, int num_nodes, Tensor? t_rowptr=None, "
        "Tensor? t_col=None, Tensor? t_perm=None) -> ()");
  // Anderson's record (dignn_kernels/solvers/anderson_update.py, AndersonVectors.record) in
  // one pass, CPU only (the GPU solves take its Triton kernel): f_new = gy_new - y_new, the
  // window's slot `slot` set to d_f = f_new - f and d_g = gy_new - gy, and the float64 sums
  // [1 + 2 count, d]: ||f_new||^2 per channel, then <d_f[j], d_f[slot]> and <d_f[j], f_new>
  // per channel for j < count.
  m.def("anderson_record(Tensor gy_new, Tensor y_new, Tensor f, Tensor gy, Tensor(a!) d_f, "
        "Tensor(b!) d_g, int slot, int count) -> (Tensor f_new, Tensor sums)");
  // The implicit layer's forward solve, Z = X - (1/mu) Delta Z by fixed-point iteration.
  // Neural Laplacian when p and q are given (edge_value = a); otherwise edge_value holds
  // the fixed weights W and kappa their diagonal (row sums when omitted).
  // The transposed CSR (directed graphs) is only carried to the backward.
  // stats = [iterations, ||Z_t - Z_{t-1}||_F, that over ||Z_t||_F] (float64).
  // storage_dtype: bfloat16 or float16 iterates with float32 x (csrc/ops/solve.h); z and
  // the outputs of both ops stay in x's dtype.
  m.def("implicit_diffusion(Tensor rowptr, Tensor col, Tensor edge_value, Tensor x, "
        "Tensor chi, Tensor? p, Tensor? q, Tensor? kappa, float mu, float eps, "
        "int max_iter, float tol, Tensor? t_rowptr=None, Tensor? t_col=None, "
        "Tensor? t_perm=None, ScalarType? storage_dtype=None) "
        "-> (Tensor z, Tensor w, Tensor kappa_out, Tensor stats)");
  // Its backward: the adjoint iteration and the fused gradient pass; stats as above, of
  // the adjoint solve u = g - (1/mu) Delta^T u.
  m.def("implicit_diffusion_backward(Tensor rowptr, Tensor col, Tensor edge_value, "
        "Tensor w, Tensor kappa, Tensor? t_rowptr, Tensor? t_col, Tensor? t_perm, "
        "Tensor x, Tensor chi, Tensor? p, Tensor? q, Tensor z, Tensor grad_z, float mu, "
        "float eps, int max_iter, float tol, ScalarType? storage_dtype=None) "
        "-> (Tensor grad_x, Tensor grad_chi, Tensor grad_p, Tensor grad_q, Tensor stats)");
}

TORCH_LIBRARY_IMPL(dignn, Autograd, m) {
  for (const char* name : {"check_graph", "neural_edge_weights_backward", "diffusion_step",
                           "csr_fma", "csr_schedule", "row_product",
                           "neural_weight_grad", "implicit_diffusion_backward",
                           "anderson_record"}) {
    m.impl(name, torch::autograd::autogradNotImplementedFallback());
  }
}
