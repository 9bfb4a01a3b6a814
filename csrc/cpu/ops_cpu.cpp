// The dignn ops on the CPU: the ops of csrc/ops/ over the CPU's Passes (cpu_passes.h).
#include <torch/library.h>

#include "cpu/cpu_passes.h"
#include "ops/register.h"

TORCH_LIBRARY_IMPL(dignn, CPU, m) {
  dignn::ops::for_each_kernel<dignn::cpu::CpuPasses>(
      [&](const char* name, auto kernel) { m.impl(name, kernel); });
}
