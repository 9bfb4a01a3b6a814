// One instruction-set build of the CPU passes (passes_impl.h), included by each
// csrc/cpu/passes_<isa>.cpp after it defines
//   DIGNN_ISA         the namespace of this build, dignn::cpu::<isa> (dispatch.cpp picks one);
//   DIGNN_VEC_BYTES   the SIMD width, 16, 32 or 64;
//   DIGNN_ISA_TARGET  the compiler's target string for a wider set than the baseline's (such
//                     a build exists only where DIGNN_CPU_MULTI_ISA, and runs only on CPUs
//                     that have the set).
// The target is switched after every header is included: only the passes are compiled for it.

// The templates of laplacian_math.h are instantiated here on vectors of the target's width;
// GCC warns that returning one changes their ABI, as they are defined for the baseline target.
// They are always inlined, so no call returns one.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "cpu/passes_common.h"

#if !defined(DIGNN_ISA_TARGET) || DIGNN_CPU_MULTI_ISA

#define DIGNN_PRAGMA(text) _Pragma(#text)
#if defined(DIGNN_ISA_TARGET) && defined(__clang__)
#define DIGNN_PUSH_TARGET(isa) \
  DIGNN_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
DIGNN_PUSH_TARGET(DIGNN_ISA_TARGET)
#elif defined(DIGNN_ISA_TARGET)
#define DIGNN_PUSH_TARGET(isa) DIGNN_PRAGMA(GCC target(isa))
#pragma GCC push_options
DIGNN_PUSH_TARGET(DIGNN_ISA_TARGET)
#endif

namespace dignn {
namespace cpu {
namespace DIGNN_ISA {
#include "cpu/passes_impl.h"
DIGNN_PASS_ALL_TYPES(template)
}  // namespace DIGNN_ISA
}  // namespace cpu
}  // namespace dignn

#if defined(DIGNN_ISA_TARGET) && defined(__clang__)
#pragma clang attribute pop
#elif defined(DIGNN_ISA_TARGET)
#pragma GCC pop_options
#endif

#endif
