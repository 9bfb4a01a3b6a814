// The CPU passes compiled for AVX2 + FMA + F16C (run only where the CPU has them, see
// dispatch.cpp).
#define DIGNN_ISA avx2
#define DIGNN_VEC_BYTES 32
#define DIGNN_ISA_TARGET "avx2,fma,f16c"
#include "cpu/passes_isa.h"
