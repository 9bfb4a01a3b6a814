// The gradient pass launchers (kernels in grad_pass_impl.cuh).
#include "cuda/grad_pass_impl.cuh"

namespace dignn {
namespace DIGNN_SIMT_NS {

template <typename T>
int launch_grad_pass(const GradPassArgs<T>& args, simt::Stream stream) {
  return run_grad_pass<T>(args, stream);
}

template int launch_grad_pass<float>(const GradPassArgs<float>&, simt::Stream);
template int launch_grad_pass<double>(const GradPassArgs<double>&, simt::Stream);

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
