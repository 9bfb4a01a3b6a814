// The dignn ops on the GPU: the ops of csrc/ops/ over the GPU's Passes (device_passes.h; the
// kernels in csrc/cuda/*_impl.cuh, the math in csrc/dignn/laplacian_math.h).
#include <torch/library.h>

#include "cuda/device_passes.h"
#include "ops/register.h"

TORCH_LIBRARY_IMPL(dignn, CUDA, m) {
  dignn::ops::for_each_kernel<dignn::cuda::DevicePasses>(
      [&](const char* name, auto kernel) { m.impl(name, kernel); });
}
