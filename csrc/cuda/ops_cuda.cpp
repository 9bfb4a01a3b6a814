// CUDA implementations of the dignn ops (schemas in csrc/ops/schemas.cpp). The host code is in
// ops_impl.h (shared with the kernels' host emulator used by the tests), the kernels in
// csrc/cuda/*_impl.cuh, the math in csrc/dignn/laplacian_math.h.
#include <torch/library.h>

#include "cuda/ops_impl.h"

namespace dignn {
namespace cuda {

TORCH_LIBRARY_IMPL(dignn, CUDA, m) {
  m.impl("check_graph", &check_graph_gpu);
  m.impl("neural_edge_weights", &neural_edge_weights_gpu);
  m.impl("neural_edge_weights_backward", &neural_edge_weights_backward_gpu);
  m.impl("diffusion_step", &diffusion_step_gpu);
  m.impl("csr_fma", &csr_fma_gpu);
  m.impl("neural_weight_grad", &neural_weight_grad_gpu);
  m.impl("implicit_diffusion", &implicit_diffusion_gpu);
  m.impl("implicit_diffusion_backward", &implicit_diffusion_backward_gpu);
}

}  // namespace cuda
}  // namespace dignn
