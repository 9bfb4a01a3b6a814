// The dignn ops on the CPU: the ops of csrc/ops/ over the CPU's Passes (cpu_passes.h), and
// Anderson's record (CPU only).
#include <torch/library.h>

#include <tuple>

#include "cpu/cpu_passes.h"
#include "ops/register.h"

namespace {

// Anderson's record on the CPU (schemas.cpp; the GPU solves take the Triton record).
std::tuple<at::Tensor, at::Tensor> anderson_record(const at::Tensor& gy_new,
                                                   const at::Tensor& y_new, const at::Tensor& f,
                                                   const at::Tensor& gy, at::Tensor& d_f,
                                                   at::Tensor& d_g, int64_t slot,
                                                   int64_t count) {
  dignn::check_anderson_record_args(gy_new, y_new, f, gy, d_f, d_g, slot, count);
  at::Tensor f_new = at::empty_like(gy_new);
  at::Tensor sums =
      at::empty({1 + 2 * count, gy_new.size(1)}, gy_new.options().dtype(at::kDouble));
  dignn::cpu::anderson_record(gy_new, y_new, f, gy, f_new, d_f, d_g, slot, count, sums);
  return {f_new, sums};
}

}  // namespace

TORCH_LIBRARY_IMPL(dignn, CPU, m) {
  dignn::ops::for_each_kernel<dignn::cpu::CpuPasses>(
      [&](const char* name, auto kernel) { m.impl(name, kernel); });
  m.impl("anderson_record", &anderson_record);
}
