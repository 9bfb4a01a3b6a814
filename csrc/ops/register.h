// Every dignn op (schemas in csrc/ops/schemas.cpp) with its kernel written over one backend's
// Passes (csrc/ops/passes.h): what csrc/cpu/ops_cpu.cpp and csrc/cuda/ops_cuda.cpp register with
// the dispatcher, and the kernels' emulator (tests/cuda_emulation) with Python.
#pragma once

#include "ops/building_blocks.h"
#include "ops/solve.h"

namespace dignn {
namespace ops {

// Calls add(name, kernel) for every op that Passes runs, kernel a function pointer (every op
// on every Passes but anderson_record, which runs on the CPU only: Passes::kAndersonRecord).
template <typename Passes, typename Add>
void for_each_kernel(Add&& add) {
  add("check_graph", &check_graph<Passes>);
  add("neural_edge_weights", &neural_edge_weights<Passes>);
  add("neural_edge_weights_backward", &neural_edge_weights_backward<Passes>);
  add("diffusion_step", &diffusion_step<Passes>);
  add("csr_fma", &csr_fma<Passes>);
  add("csr_schedule", &csr_schedule<Passes>);
  add("row_product", &row_product<Passes>);
  add("neural_weight_grad", &neural_weight_grad<Passes>);
  add("implicit_diffusion", &implicit_diffusion<Passes>);
  add("implicit_diffusion_backward", &implicit_diffusion_backward<Passes>);
  if constexpr (Passes::kAndersonRecord) add("anderson_record", &anderson_record<Passes>);
}

}  // namespace ops
}  // namespace dignn
