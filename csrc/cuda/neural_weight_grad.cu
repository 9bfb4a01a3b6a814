// The gradient pass kernels, compiled for each dtype (neural_weight_grad_impl.cuh).
#include "cuda/neural_weight_grad_impl.cuh"

namespace dignn {
namespace DIGNN_SIMT_NS {
DIGNN_INSTANTIATE_PASS_LAUNCHER(launch_neural_weight_grad, NeuralWeightGradArgs)
}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
