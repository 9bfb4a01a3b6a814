// The CPU passes for the baseline instruction set (SSE2 on x86-64; any other CPU).
#include "cpu/passes_common.h"

namespace dignn {
namespace cpu {
namespace generic {
#define DIGNN_VEC_BYTES 16
#include "cpu/passes_impl.h"
#undef DIGNN_VEC_BYTES
DIGNN_PASS_ALL_TYPES(template)
}  // namespace generic
}  // namespace cpu
}  // namespace dignn
