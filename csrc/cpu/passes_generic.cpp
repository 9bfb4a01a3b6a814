// The CPU passes for the baseline instruction set (SSE2 on x86-64; any other CPU).
#define DIGNN_ISA generic
#define DIGNN_VEC_BYTES 16
#include "cpu/passes_isa.h"
