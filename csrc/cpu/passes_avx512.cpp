// The CPU passes compiled for AVX-512 (F, VL, BW, DQ) + FMA + F16C (run only where the CPU has
// them, see dispatch.cpp).
#define DIGNN_ISA avx512
#define DIGNN_VEC_BYTES 64
#define DIGNN_ISA_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c"
#include "cpu/passes_isa.h"
