// The CPU passes compiled for AVX2 + FMA (run only where the CPU has them, see dispatch.cpp).
// The templates of laplacian_math.h are instantiated below on vectors of this target's width;
// GCC warns that returning one changes their ABI, as they are defined for the baseline target.
// They are always inlined, so no call returns one.
#pragma GCC diagnostic ignored "-Wpsabi"
#include "cpu/passes_common.h"

#if DIGNN_CPU_MULTI_ISA
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace dignn {
namespace cpu {
namespace avx2 {
#define DIGNN_VEC_BYTES 32
#include "cpu/passes_impl.h"
#undef DIGNN_VEC_BYTES
DIGNN_PASS_ALL_TYPES(template)
}  // namespace avx2
}  // namespace cpu
}  // namespace dignn
#ifdef __clang__
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif
