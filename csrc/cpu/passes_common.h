// What every per-instruction-set build of the CPU passes includes before switching the
// compiler's target (see passes_impl.h), and the declarations dispatch.cpp calls.
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>  // the 16-bit conversions of the x86 builds (passes_impl.h)
#endif

#include "cpu/kernels.h"
#include "cpu/parallel_rows.h"
#include "dignn/laplacian_math.h"

// x86-64 with GCC or Clang: the passes are also built for AVX2+FMA and AVX-512 and chosen at
// run time; elsewhere only the baseline build exists.
#if defined(__x86_64__) && defined(__GNUC__)
#define DIGNN_CPU_MULTI_ISA 1
#else
#define DIGNN_CPU_MULTI_ISA 0
#endif

namespace dignn {
namespace cpu {

inline StepNorms reduce_norms(const std::vector<StepNorms>& parts) {
  StepNorms total;
  for (const auto& p : parts) {  // in chunk order: deterministic
    total.diff_sq += p.diff_sq;
    total.out_sq += p.out_sq;
  }
  return total;
}

}  // namespace cpu
}  // namespace dignn

// Declares (in the current namespace) or explicitly instantiates the pass templates: every
// pass for compute dtype T and index type I with iterates stored in T, and the row and
// gradient passes for float with iterates stored in 16 bits (DIGNN_STORAGE16_SIGNATURES),
// the row pass also with a float output (the wide last iteration of a 16-bit solve).
#define DIGNN_ROW_PASS_SIGNATURE(PREFIX, T, I, S, O)                                       \
  PREFIX StepNorms row_pass_t<T, I, S, O>(const int64_t*, const I*, const T*, const T*,   \
                                          const T*, const T*, const S*, int64_t, int64_t, \
                                          O*);
#define DIGNN_ROW_GRAD_SIGNATURES(PREFIX, T, I, S)                                            \
  DIGNN_ROW_PASS_SIGNATURE(PREFIX, T, I, S, S)                                                \
  PREFIX void neural_weight_grad_t<T, I, S>(const int64_t*, const I*, const T*, const T*,     \
                                            const T*, int64_t, int64_t, T, const S*, const S*, \
                                            int64_t, const T*, const int64_t*, const I*,       \
                                            const T*, const T*, T*, T*);

#define DIGNN_RECORD_SIGNATURE(PREFIX, T)                                                 \
  PREFIX void anderson_record_t<T>(const T*, const T*, const T*, const T*, T*, T*, T*,   \
                                   int64_t, int64_t, int64_t, int64_t, double*);

#define DIGNN_PASS_SIGNATURES(PREFIX, T, I)                                                  \
  PREFIX StepNorms neural_edge_pass_t<T, I>(const int64_t*, const I*, const T*, const T*,   \
                                            const T*, int64_t, int64_t, T, T*, T*, const T*, \
                                            const T*, const T*, int64_t, T, T*);            \
  DIGNN_ROW_GRAD_SIGNATURES(PREFIX, T, I, T)

#define DIGNN_STORAGE16_SIGNATURES(PREFIX, I)                        \
  DIGNN_ROW_GRAD_SIGNATURES(PREFIX, float, I, c10::BFloat16)        \
  DIGNN_ROW_GRAD_SIGNATURES(PREFIX, float, I, c10::Half)            \
  DIGNN_ROW_PASS_SIGNATURE(PREFIX, float, I, c10::BFloat16, float) \
  DIGNN_ROW_PASS_SIGNATURE(PREFIX, float, I, c10::Half, float)

#define DIGNN_PASS_ALL_TYPES(PREFIX)             \
  DIGNN_RECORD_SIGNATURE(PREFIX, float)          \
  DIGNN_RECORD_SIGNATURE(PREFIX, double)         \
  DIGNN_PASS_SIGNATURES(PREFIX, float, int32_t)  \
  DIGNN_PASS_SIGNATURES(PREFIX, float, int64_t)  \
  DIGNN_PASS_SIGNATURES(PREFIX, double, int32_t) \
  DIGNN_PASS_SIGNATURES(PREFIX, double, int64_t) \
  DIGNN_STORAGE16_SIGNATURES(PREFIX, int32_t)    \
  DIGNN_STORAGE16_SIGNATURES(PREFIX, int64_t)

#define DIGNN_PASS_TEMPLATE_DECLS                                                            \
  template <typename T, typename I>                                                          \
  StepNorms neural_edge_pass_t(const int64_t*, const I*, const T*, const T*, const T*,       \
                               int64_t, int64_t, T, T*, T*, const T*, const T*, const T*,    \
                               int64_t, T, T*);                                             \
  template <typename T>                                                                      \
  void anderson_record_t(const T*, const T*, const T*, const T*, T*, T*, T*, int64_t,       \
                         int64_t, int64_t, int64_t, double*);                               \
  template <typename T, typename I, typename S, typename O>                                  \
  StepNorms row_pass_t(const int64_t*, const I*, const T*, const T*, const T*, const T*,     \
                       const S*, int64_t, int64_t, O*);                                     \
  template <typename T, typename I, typename S>                                              \
  void neural_weight_grad_t(const int64_t*, const I*, const T*, const T*, const T*, int64_t,  \
                            int64_t, T, const S*, const S*, int64_t, const T*, const int64_t*, \
                            const I*, const T*, const T*, T*, T*);
