// The host side of one GPU op: the device guard and stream, launch errors, and the checks that
// pick a kernel's shape from its tensors. Compiled for the CUDA build and for the kernels'
// host emulator (DIGNN_SIMT_EMULATION, tests only).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <initializer_list>
#include <limits>

#include "cuda/launch.h"

#if !defined(DIGNN_SIMT_EMULATION)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dignn {
namespace DIGNN_SIMT_NS {

#if defined(DIGNN_SIMT_EMULATION)
class DeviceScope {
 public:
  explicit DeviceScope(const at::Tensor&) {}
  simt::Stream stream() const { return 0; }
};
inline void check_status(int status, const char* what) {
  TORCH_CHECK(status == 0, "emulated kernel ", what, " failed with status ", status);
}
#else
class DeviceScope {
 public:
  explicit DeviceScope(const at::Tensor& t) : guard_(t.device()) {}
  simt::Stream stream() const { return c10::cuda::getCurrentCUDAStream().stream(); }

 private:
  c10::cuda::CUDAGuard guard_;
};
inline void check_status(int status, const char* what) {
  TORCH_CHECK(status == 0, "dignn CUDA kernel ", what, " failed to launch: ",
              cudaGetErrorString(static_cast<cudaError_t>(status)));
}
#endif

// The kernels index nodes with int32 (as CSRGraph stores them): int64 columns are converted.
inline at::Tensor index32(const at::Tensor& col, int64_t n) {
  TORCH_CHECK(n <= std::numeric_limits<int32_t>::max(),
              "the GPU kernels support graphs of up to 2^31 - 1 nodes, got ", n);
  return col.scalar_type() == at::kInt ? col.contiguous() : col.to(at::kInt).contiguous();
}

// The data of a tensor that may be undefined (null).
template <typename T>
T* data_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// 4 (channel vectors of 4 elements: 16-byte loads, 8-byte ones of 16-bit storage) for float32
// compute when every width is a multiple of 4 and every defined row tensor is aligned to 4 of
// its elements; else 1.
inline int vector_width(at::ScalarType compute, std::initializer_list<int64_t> widths,
                        std::initializer_list<const at::Tensor*> rows) {
  if (compute != at::kFloat) return 1;
  for (int64_t w : widths) {
    if (w % 4 != 0) return 1;
  }
  for (const at::Tensor* t : rows) {
    if (t->defined() && reinterpret_cast<uintptr_t>(t->data_ptr()) % (4 * t->element_size()) != 0) {
      return 1;
    }
  }
  return 4;
}

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
