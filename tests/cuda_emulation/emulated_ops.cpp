// The dignn GPU ops with their kernels run by the host emulator of csrc/cuda/simt.cuh (each
// CUDA thread a fiber, blocks one after another) on CPU tensors: the exact kernel and host
// code of the CUDA build, testable without a GPU. Built on demand by
// tests/test_cuda_emulated.py (torch.utils.cpp_extension.load); never part of the package.
#define DIGNN_SIMT_EMULATION 1
// Rows of more than 8 edges are heavy rows, cut into segments, so that the tests' small graphs
// exercise the heavy-row kernels as much as the rest (the CUDA build uses 128).
#define DIGNN_SEGMENT_EDGES 8

#include <torch/extension.h>

#include "cuda/device_passes.h"
#include "cuda/neural_weight_grad.cu"
#include "cuda/row_pass.cu"
#include "cuda/small_kernels.cu"
#include "ops/register.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using Passes = dignn::emulated::DevicePasses;
  dignn::ops::for_each_kernel<Passes>([&](const char* name, auto kernel) { m.def(name, kernel); });
  // check_graph without the transposed CSR too
  m.def("check_graph", &dignn::ops::check_graph<Passes>, py::arg("rowptr"), py::arg("col"),
        py::arg("num_nodes"), py::arg("t_rowptr") = py::none(), py::arg("t_col") = py::none(),
        py::arg("t_perm") = py::none());
  // row_product's schedule from a Python list (pybind has no caster for at::TensorList)
  m.def("row_product", [](const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& w,
                          const at::Tensor& cy, const at::Tensor& rs,
                          const std::vector<at::Tensor>& schedule, const at::Tensor& y,
                          const at::Tensor& out, const at::Tensor& done) {
    return dignn::ops::row_product<Passes>(rowptr, col, w, cy, rs, schedule, y, out, done);
  });
  // csr_fma's optional schedule, the same way (7 arguments: made in the call)
  m.def(
      "csr_fma",
      [](const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& w,
         const at::Tensor& y, const at::Tensor& b, const at::Tensor& cy, const at::Tensor& rs,
         const std::optional<std::vector<at::Tensor>>& schedule) {
        return dignn::ops::csr_fma<Passes>(
            rowptr, col, w, y, b, cy, rs,
            schedule ? std::optional<at::TensorList>(*schedule) : std::nullopt);
      },
      py::arg("rowptr"), py::arg("col"), py::arg("w"), py::arg("y"), py::arg("b"),
      py::arg("cy"), py::arg("rs"), py::arg("schedule") = py::none());
  m.attr("segment_edges") = dignn::emulated::kSegmentEdges;
}
