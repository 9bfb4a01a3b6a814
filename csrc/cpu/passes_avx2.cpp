// The CPU passes compiled for AVX2 + FMA (run only where the CPU has them, see dispatch.cpp).
#define DIGNN_ISA avx2
#define DIGNN_VEC_BYTES 32
#define DIGNN_ISA_TARGET "avx2,fma"
#include "cpu/passes_isa.h"
