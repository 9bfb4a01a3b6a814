// The row pass kernels, compiled for each dtype (row_pass_impl.cuh).
#include "cuda/row_pass_impl.cuh"

namespace dignn {
namespace DIGNN_SIMT_NS {
DIGNN_INSTANTIATE_ROW_PASS_LAUNCHER
}  // namespace DIGNN_SIMT_NS
}  // namespace dignn
