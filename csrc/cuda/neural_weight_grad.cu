// The gradient pass kernels, compiled for each dtype (grad_pass_impl.cuh).
#include "cuda/grad_pass_impl.cuh"

namespace dignn {
namespace DIGNN_SIMT_NS {
DIGNN_INSTANTIATE_PASS_LAUNCHER(launch_grad_pass, GradPassArgs)
}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
