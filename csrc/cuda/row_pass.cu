// The row pass launchers (kernels in row_pass_impl.cuh).
#include "cuda/row_pass_impl.cuh"

namespace dignn {
namespace DIGNN_SIMT_NS {

template <typename T>
int launch_row_pass(const RowPassArgs<T>& args, simt::Stream stream) {
  return run_row_pass<T>(args, stream);
}

template int launch_row_pass<float>(const RowPassArgs<float>&, simt::Stream);
template int launch_row_pass<double>(const RowPassArgs<double>&, simt::Stream);

}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
