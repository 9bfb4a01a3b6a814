// The dignn GPU ops with their kernels run by the host emulator of csrc/cuda/simt.cuh (each
// CUDA thread an OS thread, blocks one after another) on CPU tensors: the exact kernel and
// host code of the CUDA build, testable without a GPU. Built on demand by
// tests/test_cuda_emulated.py (torch.utils.cpp_extension.load); never part of the package.
#define DIGNN_SIMT_EMULATION 1
// Rows of more than 8 edges are heavy rows, cut into segments, so that the tests' small graphs
// exercise the heavy-row kernels as much as the rest (the CUDA build uses 128).
#define DIGNN_SEGMENT_EDGES 8

#include <torch/extension.h>

#include "cuda/grad_pass.cu"
#include "cuda/ops_impl.h"
#include "cuda/row_pass.cu"
#include "cuda/small_kernels.cu"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace dignn::emulated;
  namespace py = pybind11;
  m.def("check_graph", &check_graph_gpu, py::arg("rowptr"), py::arg("col"),
        py::arg("num_nodes"), py::arg("t_rowptr") = py::none(), py::arg("t_col") = py::none(),
        py::arg("t_perm") = py::none());
  m.def("neural_edge_weights", &neural_edge_weights_gpu);
  m.def("neural_edge_weights_backward", &neural_edge_weights_backward_gpu);
  m.def("diffusion_step", &diffusion_step_gpu);
  m.def("csr_fma", &csr_fma_gpu);
  m.def("neural_weight_grad", &neural_weight_grad_gpu);
  m.def("implicit_diffusion", &implicit_diffusion_gpu);
  m.def("implicit_diffusion_backward", &implicit_diffusion_backward_gpu);
  m.attr("segment_edges") = kSegmentEdges;
}
