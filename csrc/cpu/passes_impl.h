// The CPU row passes, written once and compiled for several instruction sets: passes_isa.h
// includes this file inside namespace dignn::cpu::<isa> with DIGNN_VEC_BYTES (16, 32 or 64)
// and the compiler's target switched; dispatch.cpp picks one at run time. Math:
// csrc/dignn/laplacian_math.h. Headers must be included *before* this file, so that only the
// code below is compiled for the wider target.
//
// Speed: a row's channel sums are held in kAcc vector registers (GCC/Clang vector types), so a
// CSR row is one streaming loop of loads and FMAs; dot products keep several independent
// partial sums. The order of every sum is fixed by the code: results do not change from run
// to run or with the thread count.

// The sum of the N lanes of v: the upper half added to the lower until one lane is left.
template <typename T, int N>
inline T halving_sum(T __attribute__((vector_size(N * sizeof(T)))) v) {
  if constexpr (N == 2) {
    return v[0] + v[1];
  } else {
    typedef T half __attribute__((vector_size(N / 2 * sizeof(T))));
    half lo, hi;
    __builtin_memcpy(&lo, &v, sizeof(half));
    __builtin_memcpy(&hi, reinterpret_cast<const char*>(&v) + sizeof(half), sizeof(half));
    return halving_sum<T, N / 2>(lo + hi);
  }
}

template <typename T>
struct Simd {
  typedef T vec __attribute__((vector_size(DIGNN_VEC_BYTES)));
  static constexpr int kLanes = DIGNN_VEC_BYTES / sizeof(T);
  static constexpr int kAcc = 8;  // accumulator registers of a row block
  static constexpr int kBlock = kAcc * kLanes;
  static inline vec load(const T* p) {
    vec v;
    __builtin_memcpy(&v, p, sizeof(vec));
    return v;
  }
  static inline void store(T* p, vec v) { __builtin_memcpy(p, &v, sizeof(vec)); }
  static inline vec splat(T s) { return vec{} + s; }
  // The lanes' sum by halving: the upper half added to the lower until one lane is left
  // (log2(lanes) dependent adds, not a chain of one add per lane; a fixed order).
  static inline T sum(vec v) { return halving_sum<T, kLanes>(v); }
};

// Neighbour rows are gathered at random; asking for the row of an edge a few edges ahead
// hides most of the cache-miss latency.
constexpr int kPrefetchEdges = 4;

template <typename T>
inline void prefetch_row(const T* row, int64_t len) {
  for (int64_t c = 0; c < len; c += 64 / sizeof(T)) __builtin_prefetch(row + c, 0, 3);
}

// ------------------------------------------------------- edge scalars, many at a time --
// The per-edge formulas of laplacian_math.h (edge_weight, edge_grad_scalars), evaluated over a
// row's edges at once. glibc's scalar tanhf costs more than the rest of an edge, so float
// feeds them the factors of tanh_abs_vec below (within a few ulp, tested against the float64
// path); double keeps the exact scalar functions.

typedef float FVec __attribute__((vector_size(DIGNN_VEC_BYTES)));
typedef int32_t IVec __attribute__((vector_size(DIGNN_VEC_BYTES)));
constexpr int kFloatLanes = DIGNN_VEC_BYTES / sizeof(float);

// tanh(|x|) = a + a^3 P(a^2) (odd Taylor series) for a = |x| < 0.625, where the next term
// is below half an ulp; beyond, laplacian_math.h's tanh_sech2 form: with e = exp(-2a),
// tanh = (1 - e) / (1 + e) and s2 = 1 - tanh^2 = 4 e / (1 + e)^2, both to full relative
// precision (s2 down to float's smallest normal numbers; 0 once 2a > 87, where e is below
// them). exp by Cody-Waite reduction, 2a = k ln2 + r with |r| <= ln2/2, e = 2^-k exp(-r), and
// a degree-7 polynomial. Returns tanh(|x|); the caller restores the sign.
inline FVec tanh_abs_vec(FVec x, FVec* sech2) {
  const FVec a = (FVec)((IVec)x & 0x7fffffff);
  const FVec a2 = a * a;
  FVec poly = FVec{} + 6404582.0f / 10854718875.0f;
  poly = poly * a2 - 929569.0f / 638512875.0f;
  poly = poly * a2 + 21844.0f / 6081075.0f;
  poly = poly * a2 - 1382.0f / 155925.0f;
  poly = poly * a2 + 62.0f / 2835.0f;
  poly = poly * a2 - 17.0f / 315.0f;
  poly = poly * a2 + 2.0f / 15.0f;
  poly = poly * a2 - 1.0f / 3.0f;
  const FVec small = a + a * a2 * poly;
  FVec y = a + a;
  const auto underflows = y > 87.0f;  // 2^-k stays a normal float for k <= 126
  y = underflows ? FVec{} + 87.0f : y;
  const IVec k = __builtin_convertvector(y * 1.44269504088896341f + 0.5f, IVec);
  const FVec kf = __builtin_convertvector(k, FVec);
  const FVec r = (kf * 0.693145751953125f - y) + kf * 1.42860682030941723212e-6f;  // -r above
  FVec e = FVec{} + 1.0f / 5040.0f;
  e = e * r + 1.0f / 720.0f;
  e = e * r + 1.0f / 120.0f;
  e = e * r + 1.0f / 24.0f;
  e = e * r + 1.0f / 6.0f;
  e = e * r + 0.5f;
  e = e * r + 1.0f;
  e = e * r + 1.0f;
  e = e * (FVec)((127 - k) << 23);  // * 2^-k
  e = underflows ? FVec{} : e;
  const FVec inv = 1.0f / (1.0f + e);
  const FVec large = (1.0f - e) * inv;
  const auto use_small = a < 0.625f;
  if (sech2 != nullptr) *sech2 = use_small ? 1.0f - small * small : 4.0f * e * inv * inv;
  return use_small ? small : large;
}

inline FVec load_f(const float* p) {
  FVec v;
  __builtin_memcpy(&v, p, sizeof(FVec));
  return v;
}

inline void store_f(float* p, FVec v) { __builtin_memcpy(p, &v, sizeof(FVec)); }

// w[e] = neural_edge_weight(a[e], pi[e], rho[e], eps) for e < count.
inline void edge_weights_batch(const double* a, const double* pi, const double* rho,
                               double eps, double* w, int64_t count) {
  for (int64_t e = 0; e < count; ++e) w[e] = neural_edge_weight(a[e], pi[e], rho[e], eps);
}

inline void edge_weights_batch(const float* a, const float* pi, const float* rho, float eps,
                               float* w, int64_t count) {
  int64_t e = 0;
  for (; e + kFloatLanes <= count; e += kFloatLanes) {
    const FVec t = tanh_abs_vec(inverse_distance(load_f(rho + e), eps), nullptr);
    const FVec phi = tanh_abs_vec(load_f(pi + e), nullptr);
    store_f(w + e, edge_weight(load_f(a + e), t, phi));
  }
  for (; e < count; ++e) w[e] = neural_edge_weight(a[e], pi[e], rho[e], eps);
}

// From the edge gradient g[e]: (cp[e], cq[e]) = neural_edge_grad_scalars(a, g, pi, rho, eps).
inline void edge_grad_batch(const double* a, const double* g, const double* pi,
                            const double* rho, double eps, double* cp, double* cq,
                            int64_t count) {
  for (int64_t e = 0; e < count; ++e) {
    const EdgeGradScalars<double> c = neural_edge_grad_scalars(a[e], g[e], pi[e], rho[e], eps);
    cp[e] = c.cp;
    cq[e] = c.cq;
  }
}

inline void edge_grad_batch(const float* a, const float* g, const float* pi, const float* rho,
                            float eps, float* cp, float* cq, int64_t count) {
  int64_t e = 0;
  for (; e + kFloatLanes <= count; e += kFloatLanes) {
    const FVec p = load_f(pi + e), r = load_f(rho + e);
    EdgeTanhFactors<FVec> f;
    f.s = inverse_distance(r, eps);
    f.t = tanh_abs_vec(f.s, &f.t_s2);
    f.phi = tanh_abs_vec(p, &f.phi_s2);
    const EdgeGradScalars<FVec> c = edge_grad_scalars(load_f(a + e), load_f(g + e), p, r, f);
    store_f(cp + e, c.cp);
    store_f(cq + e, c.cq);
  }
  for (; e < count; ++e) {
    const EdgeGradScalars<float> c = neural_edge_grad_scalars(a[e], g[e], pi[e], rho[e], eps);
    cp[e] = c.cp;
    cq[e] = c.cq;
  }
}

// ----------------------------------------------------------------- 16-bit storage --
// A solve's iterates may be stored in bfloat16 or float16 (storage_dtype): the row pass reads
// y and writes out in that dtype, the gradient pass reads z and v in it. Every load widens to
// the compute dtype float (exact), every sum runs in float, and the row pass rounds its
// output to nearest even on the store, as torch's .to(dtype) does. Stored<S> names the element
// type S of such a tensor (float, double, c10::BFloat16 or c10::Half) and its loads and stores
// of one compute vector or scalar; for S = T they are plain.

typedef uint16_t HalfWords __attribute__((vector_size(DIGNN_VEC_BYTES / 2)));
typedef uint32_t Words __attribute__((vector_size(DIGNN_VEC_BYTES)));

// The bfloat16 bits of a vector of float bits b, rounded to nearest even; NaN becomes the quiet
// NaN 0x7fc0: c10::BFloat16's rounding (which single values use), bit for bit.
inline Words bfloat16_bits(Words b) {
  const Words rounded = (b + (0x7fffu + ((b >> 16) & 1u))) >> 16;
  return (b & 0x7fffffffu) > 0x7f800000u ? Words{} + 0x7fc0u : rounded;
}

// Widening loads of one vector of 16-bit values with the instruction set's conversions (the
// portable vector code of the baseline build measured no faster than float32 loads in the
// AVX-512 build on cornell5, these about twice as fast: bench/layer/test_cpu_speed.py).
#if defined(__x86_64__) && DIGNN_VEC_BYTES == 64
// (the zero-masked forms with a full mask: the plain ones start from an undefined register,
// which GCC 12 reports as maybe uninitialized)
constexpr __mmask16 kAllLanes = 0xffff;
inline FVec load_bfloat16(const void* p) {
  const __m512i w = _mm512_maskz_cvtepu16_epi32(
      kAllLanes, _mm256_loadu_si256(static_cast<const __m256i*>(p)));
  return (FVec)_mm512_castsi512_ps(_mm512_maskz_slli_epi32(kAllLanes, w, 16));
}
inline FVec load_float16(const void* p) {
  return (FVec)_mm512_maskz_cvtph_ps(kAllLanes,
                                     _mm256_loadu_si256(static_cast<const __m256i*>(p)));
}
inline void store_float16(void* p, FVec v) {
  _mm256_storeu_si256(static_cast<__m256i*>(p),
                      _mm512_maskz_cvtps_ph(kAllLanes, (__m512)v,
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#elif defined(__x86_64__) && DIGNN_VEC_BYTES == 32
inline FVec load_bfloat16(const void* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  return (FVec)_mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline FVec load_float16(const void* p) {
  return (FVec)_mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
}
inline void store_float16(void* p, FVec v) {
  _mm_storeu_si128(static_cast<__m128i*>(p),
                   _mm256_cvtps_ph((__m256)v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#else  // the baseline build (SSE2 on x86-64, NEON on aarch64, any CPU): portable vector code
// The vectors of 16-bit values at p as the high halves of 32-bit lanes (h << 16), where both
// the bfloat16 and the float16 widening start. On a little-endian CPU, zero halves interleaved
// with h are that: one instruction (SSE2 punpcklwd, NEON zip1). GCC lowers the plain
// __builtin_convertvector(h, Words) << 16 to two loads, four shuffles and a shift under SSE2,
// which made this build's cached sweep on cornell5 slower with bfloat16 iterates than with
// float32 ones (bench/layer/test_cpu_speed.py).
inline Words high_halves(const void* p) {
  HalfWords h;
  __builtin_memcpy(&h, p, sizeof(h));
#if DIGNN_VEC_BYTES == 16 && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ && \
    (defined(__clang__) || __GNUC__ >= 12)
  return (Words)__builtin_shufflevector(HalfWords{}, h, 0, 4, 1, 5, 2, 6, 3, 7);
#else
  return __builtin_convertvector(h, Words) << 16;
#endif
}
inline FVec load_bfloat16(const void* p) { return (FVec)high_halves(p); }

// The float16 conversions, a vector at a time and bit for bit those of c10::Half's portable
// code (c10::detail::fp16_ieee_to_fp32_value and fp16_ieee_from_fp32_value), which torch's
// float16 <-> float32 conversions equal except for NaN payloads (tests/test_storage_dtype.py).
// The load makes no subnormal float, the store only where c10's does (and its rounding then
// ignores it): flush-to-zero and denormals-are-zero modes change neither (when written, both
// were checked against c10 over all 2^16 halves and 2^32 floats, in both modes).

// float16 -> float, exact. With the half (sign s, exponent field e, 10-bit mantissa m) in the
// high half of w, ((w + w) >> 4) holds e and m where a float keeps its exponent field and the
// top of its mantissa; as float bits, raised by 224 in the exponent field, they are
// (1 + m 2^-10) 2^(e + 97), and times 2^-112, scaled = (1 + m 2^-10) 2^(e - 15):
//  - e = 1..30: the half's value, exactly;
//  - e = 31: the exponent field is 255, so inf (m = 0) or a NaN, which the product keeps (a
//    signalling NaN comes out quiet with its payload, as from c10 and the F16C conversion);
//  - e = 0 (zero and subnormals, m 2^-24), told by scaled < 2^-14: the value is
//    2 scaled - 2^-14 = m 2^-24, computed as scaled - (2^-14 - scaled), both steps exact (the
//    first within a factor of 2, the second has a float result): a normal float, or +0. (c10
//    builds it as (0.5 + m 2^-24) - 0.5 and selects; the same value.) Elsewhere scaled - 0,
//    scaled itself, NaN included.
// Then the sign goes back on.
inline FVec load_float16(const void* p) {
  const Words w = high_halves(p);
  const FVec scaled = (FVec)(((w + w) >> 4) + (224u << 23)) * 0x1p-112f;
  const IVec e_is_0 = scaled < 0x1p-14f;
  const FVec value = scaled - (FVec)(e_is_0 & (IVec)(0x1p-14f - scaled));
  return (FVec)((Words)value | (w & 0x80000000u));
}

// float -> float16, rounded to nearest even by the floating-point adder. For |f| = (1 + x) 2^E
// (0 <= x < 1) and c = 2^(max(E, -14) + 15), built by adding 15 to f's exponent field (raised
// to that of 2^-14 first), the sum c + 4|f|:
//  - E >= -14: lies in [2^(E+15), 2^(E+16)), where floats are 2^(E-8) apart: the adder rounds
//    4|f| to a multiple of 2^(E-8), so |f| to one of 2^(E-10), the half's spacing at exponent
//    E; ties to even, as c's bits below its exponent are 0. The sum's exponent field is
//    E + 142, its mantissa field round((1 + x) 2^10) < 2^12. Its low 5 exponent bits,
//    (E + 142) mod 32 = E + 14, shifted to the half's exponent field, plus that mantissa (whose
//    2^10, the leading one, adds the missing 1 to the exponent, and whose carry when rounding
//    up to 2^11 another) are the half's bits: (E + 15) << 10 plus its 10-bit mantissa. Rounding
//    up from E = 15 carries into exponent 31 with mantissa 0, inf: 65520 and above.
//  - E < -14 (half subnormals and anything smaller, float subnormals and 0): c = 2, the sum lies
//    in [2, 4), floats 2^-22 apart: |f| rounds to a multiple of 2^-24, the half's subnormal
//    spacing; the exponent field 128 gives 0 in the half's, the mantissa field round(|f| 2^24)
//    is the subnormal half (or 2^10, the smallest normal one, when rounding up to it).
//  - |f| >= 2^16, beyond every finite half, and inf: 4|f| is computed as (|f| 2^112) 2^-110, the
//    first product inf; so is the sum (c, whose bits wrap into the sign for f's largest
//    exponents, is never -inf or NaN), whose exponent bits give 31, mantissa 0: inf.
//  - NaN: 0x7e00, the quiet NaN, with the sign (the payload is dropped, as c10 does).
inline void store_float16(void* p, FVec v) {
  const Words w = (Words)v;
  const Words abs_bits = w & 0x7fffffffu;
  const FVec four_abs = ((FVec)abs_bits * 0x1p112f) * 0x1p-110f;
  const IVec field = (IVec)(w & 0x7f800000u);
  const IVec lowest = IVec{} + (113 << 23);  // the exponent field of 2^-14
  const FVec c = (FVec)((Words)(field < lowest ? lowest : field) + (15u << 23));
  const Words sum = (Words)(c + four_abs);
  const Words rounded = ((sum >> 13) & 0x7c00u) + (sum & 0xfffu);
  const Words is_nan = (Words)((IVec)abs_bits > 0x7f800000);
  const Words bits = ((w >> 16) & 0x8000u) | (is_nan ? Words{} + 0x7e00u : rounded);
  const HalfWords h = __builtin_convertvector(bits, HalfWords);
  __builtin_memcpy(p, &h, sizeof(h));
}
#endif

template <typename S>
struct Stored {  // S = T: the compute dtype itself
  using T = S;
  static inline typename Simd<T>::vec load(const S* p) { return Simd<T>::load(p); }
  static inline void store(S* p, typename Simd<T>::vec v) { Simd<T>::store(p, v); }
  static inline T load_one(const S* p) { return *p; }
  static inline void store_one(S* p, T v) { *p = v; }
  // What store(p, v) stored at p, in T: v rounded to S (here v itself).
  static inline typename Simd<T>::vec reload(const S*, typename Simd<T>::vec v) { return v; }
  static inline T reload_one(const S*, T v) { return v; }
};

template <>
struct Stored<c10::BFloat16> {
  using T = float;
  using S = c10::BFloat16;
  static inline FVec load(const S* p) { return load_bfloat16(p); }
  static inline void store(S* p, FVec v) {
    const HalfWords h = __builtin_convertvector(bfloat16_bits((Words)v), HalfWords);
    __builtin_memcpy(p, &h, sizeof(h));
  }
  static inline float load_one(const S* p) { return static_cast<float>(*p); }
  static inline void store_one(S* p, float v) { *p = c10::BFloat16(v); }
  static inline FVec reload(const S* p, FVec) { return load(p); }
  static inline float reload_one(const S* p, float) { return load_one(p); }
};

// float16: the F16C / AVX-512 conversions (round to nearest even), the baseline build's vector
// code (c10::Half's results) elsewhere, and c10::Half for single values (torch's own).
template <>
struct Stored<c10::Half> {
  using T = float;
  using S = c10::Half;
  static inline FVec load(const S* p) { return load_float16(p); }
  static inline void store(S* p, FVec v) { store_float16(p, v); }
  static inline float load_one(const S* p) { return static_cast<float>(*p); }
  static inline void store_one(S* p, float v) { *p = c10::Half(v); }
  static inline FVec reload(const S* p, FVec) { return load(p); }
  static inline float reload_one(const S* p, float) { return load_one(p); }
};

// ------------------------------------------------------------ dot-product reductions --
// Sum over c of f(u[c], v[c], ...) with independent vector partial sums.

// sum_c term(u[c], v[c]), term applied to vectors and then to the scalars of the tail, with 4
// vector partial sums.
template <typename T, typename Term>
inline T sum_of_terms(const T* __restrict__ u, const T* __restrict__ v, int64_t len,
                      const Term& term) {
  using S = Simd<T>;
  constexpr int64_t L = S::kLanes;
  typename S::vec s0{}, s1{}, s2{}, s3{};
  int64_t c = 0;
  for (; c + 4 * L <= len; c += 4 * L) {
    s0 += term(S::load(u + c), S::load(v + c));
    s1 += term(S::load(u + c + L), S::load(v + c + L));
    s2 += term(S::load(u + c + 2 * L), S::load(v + c + 2 * L));
    s3 += term(S::load(u + c + 3 * L), S::load(v + c + 3 * L));
  }
  for (; c + L <= len; c += L) s0 += term(S::load(u + c), S::load(v + c));
  T s = S::sum((s0 + s1) + (s2 + s3));
  for (; c < len; ++c) s += term(u[c], v[c]);
  return s;
}

// u . v
template <typename T>
inline T dot(const T* __restrict__ u, const T* __restrict__ v, int64_t len) {
  return sum_of_terms(u, v, len, [](auto a, auto b) { return a * b; });
}

// ||u - v||^2
template <typename T>
inline T dist_sq(const T* __restrict__ u, const T* __restrict__ v, int64_t len) {
  return sum_of_terms(u, v, len, [](auto a, auto b) {
    const auto t = a - b;
    return t * t;
  });
}

// (a_i - a_j) . (b_j - b_i) when kBoth, else a_i . (b_j - b_i); a and b stored as S
// (widened on load), summed in the compute dtype.
template <bool kBoth, typename S>
inline typename Stored<S>::T edge_grad_dot(const S* __restrict__ a_i, const S* __restrict__ a_j,
                                           const S* __restrict__ b_i, const S* __restrict__ b_j,
                                           int64_t len) {
  using T = typename Stored<S>::T;
  using V = Simd<T>;
  using L = Stored<S>;
  typename V::vec s0{}, s1{};
  int64_t c = 0;
  for (; c + 2 * V::kLanes <= len; c += 2 * V::kLanes) {
    const int64_t c1 = c + V::kLanes;
    const auto a0 = kBoth ? L::load(a_i + c) - L::load(a_j + c) : L::load(a_i + c);
    const auto a1 = kBoth ? L::load(a_i + c1) - L::load(a_j + c1) : L::load(a_i + c1);
    s0 += a0 * (L::load(b_j + c) - L::load(b_i + c));
    s1 += a1 * (L::load(b_j + c1) - L::load(b_i + c1));
  }
  for (; c + V::kLanes <= len; c += V::kLanes) {
    const auto a0 = kBoth ? L::load(a_i + c) - L::load(a_j + c) : L::load(a_i + c);
    s0 += a0 * (L::load(b_j + c) - L::load(b_i + c));
  }
  T s = V::sum(s0 + s1);
  for (; c < len; ++c) {
    const T ai = L::load_one(a_i + c);
    s += (kBoth ? ai - L::load_one(a_j + c) : ai) * (L::load_one(b_j + c) - L::load_one(b_i + c));
  }
  return s;
}

// ------------------------------------------------------------------ the row step --
// out_i = b_i + cy y_i + rs sum_k w_k y_j over channels [c0, c0 + NV * lanes), and the
// block's ||out_i - y_i||^2, ||out_i||^2 (of out_i as stored: the solvers' loop's norms of
// its iterates). y is stored as S (16-bit storage: widened on load), out as O: S (rounded on
// the store) or, for the wide last iteration of a 16-bit solve, the compute dtype T; b is in T.
template <int NV, typename S, typename I, typename O, typename T = typename Stored<S>::T>
inline void step_block(const T* __restrict__ b_i, const S* __restrict__ y,
                       const S* __restrict__ y_i, int64_t d, int64_t c0,
                       const I* __restrict__ col, const T* __restrict__ w, int64_t k0,
                       int64_t k1, T cy, T rs, O* __restrict__ out_i, T& diff_sq,
                       T& out_sq) {
  static_assert(std::is_same<typename Stored<O>::T, T>::value, "out in S or in T");
  using V = Simd<T>;
  using L = Stored<S>;
  using LO = Stored<O>;
  typename V::vec acc[NV];
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) acc[v] = typename V::vec{};
  for (int64_t k = k0; k < k1; ++k) {
    if (k + kPrefetchEdges < k1) {
      prefetch_row(y + static_cast<int64_t>(col[k + kPrefetchEdges]) * d + c0,
                   NV * V::kLanes);
    }
    const int64_t j = static_cast<int64_t>(col[k]);
    const typename V::vec wk = V::splat(w[k]);
    const S* __restrict__ y_j = y + j * d + c0;
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[v] += wk * L::load(y_j + v * V::kLanes);
  }
  const typename V::vec vcy = V::splat(cy), vrs = V::splat(rs);
  typename V::vec ds{}, os{};
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) {
    const int64_t c = c0 + v * V::kLanes;
    const typename V::vec yi = L::load(y_i + c);
    const typename V::vec o = V::load(b_i + c) + vcy * yi + vrs * acc[v];
    LO::store(out_i + c, o);
    const typename V::vec r = LO::reload(out_i + c, o);
    const typename V::vec t = r - yi;
    ds += t * t;
    os += r * r;
  }
  diff_sq += V::sum(ds);
  out_sq += V::sum(os);
}

template <typename S, typename I, typename O, typename T = typename Stored<S>::T>
inline void step_row(const T* __restrict__ b_i, const S* __restrict__ y,
                     const S* __restrict__ y_i, int64_t d, const I* __restrict__ col,
                     const T* __restrict__ w, int64_t k0, int64_t k1, T cy, T rs,
                     O* __restrict__ out_i, T& diff_sq, T& out_sq) {
  using V = Simd<T>;
  using L = Stored<S>;
  using LO = Stored<O>;
  int64_t c0 = 0;
  for (; c0 + V::kBlock <= d; c0 += V::kBlock) {
    step_block<V::kAcc>(b_i, y, y_i, d, c0, col, w, k0, k1, cy, rs, out_i, diff_sq, out_sq);
  }
  switch ((d - c0) / V::kLanes) {  // whole vectors left: a shorter block
#define DIGNN_STEP_TAIL(NV)                                                            \
  case NV:                                                                             \
    step_block<NV>(b_i, y, y_i, d, c0, col, w, k0, k1, cy, rs, out_i, diff_sq, out_sq); \
    c0 += NV * V::kLanes;                                                              \
    break;
    DIGNN_STEP_TAIL(1)
    DIGNN_STEP_TAIL(2)
    DIGNN_STEP_TAIL(3)
    DIGNN_STEP_TAIL(4)
    DIGNN_STEP_TAIL(5)
    DIGNN_STEP_TAIL(6)
    DIGNN_STEP_TAIL(7)
#undef DIGNN_STEP_TAIL
    default:
      break;
  }
  for (; c0 < d; ++c0) {  // channels left over (d not a multiple of the vector width)
    T acc = 0;
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t j = static_cast<int64_t>(col[k]);
      acc += w[k] * L::load_one(y + j * d + c0);
    }
    const T yi = L::load_one(y_i + c0);
    const T o = b_i[c0] + cy * yi + rs * acc;
    LO::store_one(out_i + c0, o);
    const T r = LO::reload_one(out_i + c0, o);
    const T t = r - yi;
    diff_sq += t * t;
    out_sq += r * r;
  }
}

// -------------------------------------------------------------------------- passes --

template <typename T, typename I>
StepNorms neural_edge_pass_t(const int64_t* rowptr, const I* col, const T* a, const T* p,
                             const T* q, int64_t n, int64_t h, T eps, T* w, T* kappa,
                             const T* chi, const T* x, const T* z, int64_t d, T inv_mu,
                             T* z_next) {
  const RowChunks chunks = balanced_row_chunks(rowptr, n);
  std::vector<StepNorms> parts(chunks.size());
  parallel_for_rows(chunks, [&](int64_t chunk, int64_t row_begin, int64_t row_end) {
    StepNorms local;
    std::vector<T> pi, rho;
    for (int64_t i = row_begin; i < row_end; ++i) {
      const int64_t k0 = rowptr[i], k1 = rowptr[i + 1];
      const T* p_i = p + i * h;
      const T* q_i = q + i * h;
      pi.resize(k1 - k0);
      rho.resize(k1 - k0);
      for (int64_t k = k0; k < k1; ++k) {  // pi_ij = p_i . p_j, rho_ij = ||q_i - q_j||
        if (k + kPrefetchEdges < k1) {
          const int64_t f = static_cast<int64_t>(col[k + kPrefetchEdges]);
          prefetch_row(p + f * h, h);
          prefetch_row(q + f * h, h);
        }
        const int64_t j = static_cast<int64_t>(col[k]);
        pi[k - k0] = dot(p_i, p + j * h, h);
        rho[k - k0] = dignn_sqrt(dist_sq(q_i, q + j * h, h));
      }
      edge_weights_batch(a + k0, pi.data(), rho.data(), eps, w + k0, k1 - k0);  // eq. 13-14
      T row_sum = 0;
      for (int64_t k = k0; k < k1; ++k) row_sum += w[k];
      kappa[i] = row_sum;
      if (z_next != nullptr) {  // fused: this row's step with the weights just made
        const RowCoefficients<T> rc = row_coefficients(chi[i], row_sum, inv_mu);
        T ds = 0, os = 0;
        step_row(x + i * d, z, z + i * d, d, col, w, k0, k1, rc.cy, rc.rs, z_next + i * d, ds,
                 os);
        local.diff_sq += ds;
        local.out_sq += os;
      }
    }
    parts[chunk] = local;
  });
  return reduce_norms(parts);
}

// y stored as S (the compute dtype T, or 16 bits with T = float), out as O (S, or T: the
// wide last iteration of a 16-bit solve, csrc/ops/solve.h).
template <typename T, typename I, typename S, typename O>
StepNorms row_pass_t(const int64_t* rowptr, const I* col, const T* w, const T* b, const T* cy,
                     const T* rs, const S* y, int64_t n, int64_t d, O* out) {
  const RowChunks chunks = balanced_row_chunks(rowptr, n);
  std::vector<StepNorms> parts(chunks.size());
  parallel_for_rows(chunks, [&](int64_t chunk, int64_t row_begin, int64_t row_end) {
    StepNorms local;
    for (int64_t i = row_begin; i < row_end; ++i) {
      T ds = 0, os = 0;
      step_row(b + i * d, y, y + i * d, d, col, w, rowptr[i], rowptr[i + 1], cy[i],
               rs != nullptr ? rs[i] : T(1), out + i * d, ds, os);
      local.diff_sq += ds;
      local.out_sq += os;
    }
    parts[chunk] = local;
  });
  return reduce_norms(parts);
}

// gp += sum_e cp_e p_{j_e} and gq += sum_e cq_e (q_i - q_{j_e}) over channels
// [c0, c0 + NV lanes).
template <int NV, typename T, typename I>
inline void projection_grad_block(const I* __restrict__ nbr, int64_t count,
                                  const T* __restrict__ cp, const T* __restrict__ cq, T cq_sum,
                                  const T* __restrict__ p, const T* __restrict__ q,
                                  const T* __restrict__ q_i, int64_t h, int64_t c0,
                                  T* __restrict__ gp, T* __restrict__ gq) {
  using S = Simd<T>;
  typename S::vec ap[NV], aq[NV];
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) ap[v] = aq[v] = typename S::vec{};
  for (int64_t e = 0; e < count; ++e) {
    const int64_t j = static_cast<int64_t>(nbr[e]);
    const typename S::vec a = S::splat(cp[e]), b = S::splat(cq[e]);
    const T* __restrict__ p_j = p + j * h + c0;
    const T* __restrict__ q_j = q + j * h + c0;
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      ap[v] += a * S::load(p_j + v * S::kLanes);
      aq[v] += b * S::load(q_j + v * S::kLanes);
    }
  }
  const typename S::vec vs = S::splat(cq_sum);
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) {
    const int64_t c = c0 + v * S::kLanes;
    S::store(gp + c, S::load(gp + c) + ap[v]);
    S::store(gq + c, S::load(gq + c) + vs * S::load(q_i + c) - aq[v]);
  }
}

template <typename T, typename I>
inline void accumulate_projection_grads(const I* __restrict__ nbr, int64_t count,
                                        const T* __restrict__ cp, const T* __restrict__ cq,
                                        const T* __restrict__ p, const T* __restrict__ q,
                                        const T* __restrict__ q_i, int64_t h,
                                        T* __restrict__ gp, T* __restrict__ gq) {
  using S = Simd<T>;
  constexpr int kHalf = S::kAcc / 2;  // two accumulator sets share the registers
  T cq_sum = 0;
  for (int64_t e = 0; e < count; ++e) cq_sum += cq[e];
  int64_t c0 = 0;
  for (; c0 + kHalf * S::kLanes <= h; c0 += kHalf * S::kLanes) {
    projection_grad_block<kHalf>(nbr, count, cp, cq, cq_sum, p, q, q_i, h, c0, gp, gq);
  }
  for (; c0 + S::kLanes <= h; c0 += S::kLanes) {
    projection_grad_block<1>(nbr, count, cp, cq, cq_sum, p, q, q_i, h, c0, gp, gq);
  }
  for (; c0 < h; ++c0) {
    T ap = 0, aq = 0;
    for (int64_t e = 0; e < count; ++e) {
      const int64_t j = static_cast<int64_t>(nbr[e]);
      ap += cp[e] * p[j * h + c0];
      aq += cq[e] * q[j * h + c0];
    }
    gp[c0] += ap;
    gq[c0] += cq_sum * q_i[c0] - aq;
  }
}

// The scalars of one row's edges for the gradient: G, pi, rho, then (cp, cq).
template <typename T>
struct EdgeScratch {
  std::vector<T> g, pi, rho, cp, cq;
  void resize(int64_t count) {
    g.resize(count);
    pi.resize(count);
    rho.resize(count);
    cp.resize(count);
    cq.resize(count);
  }
};

// z and v stored as S (the compute dtype T, or 16 bits with T = float).
template <typename T, typename I, typename S>
void neural_weight_grad_t(const int64_t* rowptr, const I* col, const T* a, const T* p,
                          const T* q, int64_t n, int64_t h, T eps, const S* z, const S* v,
                          int64_t d, const T* gw, const int64_t* t_rowptr, const I* t_col,
                          const T* t_a, const T* t_gw, T* grad_p, T* grad_q) {
  const bool transposed = t_rowptr != nullptr;
  const RowChunks chunks = balanced_row_chunks(rowptr, n);
  parallel_for_rows(chunks, [&](int64_t, int64_t row_begin, int64_t row_end) {
    EdgeScratch<T> s;
    for (int64_t i = row_begin; i < row_end; ++i) {
      T* gp = grad_p + i * h;
      T* gq = grad_q + i * h;
      std::fill(gp, gp + h, T(0));
      std::fill(gq, gq + h, T(0));
      const T* p_i = p + i * h;
      const T* q_i = q + i * h;
      // Row i: edges (i, j), node i the first argument of W_ij; on a symmetric graph
      // G_ij + G_ji = (v_i - v_j) . (z_j - z_i) covers the mirrored edge (j, i) too.
      // Then the transposed row i (directed graphs): edges (r, i), node i the second
      // argument of W_ri, G_ri = v_r . (z_i - z_r).
      for (int pass = 0; pass < (transposed ? 2 : 1); ++pass) {
        const bool in_edges = pass == 1;
        const int64_t k0 = in_edges ? t_rowptr[i] : rowptr[i];
        const int64_t k1 = in_edges ? t_rowptr[i + 1] : rowptr[i + 1];
        const I* nbr = in_edges ? t_col : col;
        const T* given = in_edges ? t_gw : gw;
        s.resize(k1 - k0);
        for (int64_t k = k0; k < k1; ++k) {
          if (k + kPrefetchEdges < k1) {
            const int64_t f = static_cast<int64_t>(nbr[k + kPrefetchEdges]);
            prefetch_row(p + f * h, h);
            prefetch_row(q + f * h, h);
            if (given == nullptr) {
              prefetch_row(v + f * d, d);
              prefetch_row(z + f * d, d);
            }
          }
          const int64_t j = static_cast<int64_t>(nbr[k]);
          const int64_t e = k - k0;
          if (given != nullptr) {
            s.g[e] = given[k];
          } else if (in_edges) {
            s.g[e] = edge_grad_dot<false>(v + j * d, v + j * d, z + j * d, z + i * d, d);
          } else if (transposed) {
            s.g[e] = edge_grad_dot<false>(v + i * d, v + j * d, z + i * d, z + j * d, d);
          } else {
            s.g[e] = edge_grad_dot<true>(v + i * d, v + j * d, z + i * d, z + j * d, d);
          }
          s.pi[e] = dot(p_i, p + j * h, h);
          s.rho[e] = dignn_sqrt(dist_sq(q_i, q + j * h, h));
        }
        edge_grad_batch((in_edges ? t_a : a) + k0, s.g.data(), s.pi.data(), s.rho.data(), eps,
                        s.cp.data(), s.cq.data(), k1 - k0);
        accumulate_projection_grads(nbr + k0, k1 - k0, s.cp.data(), s.cq.data(), p, q, q_i, h,
                                    gp, gq);
      }
    }
  });
}

// ------------------------------------------------------------------ Anderson's record --
// dignn_kernels.solvers.anderson_update.AndersonVectors.record in one pass over the rows (the
// window d_f, d_g: m slots of n x d, slot-major): f_new = gy_new - y_new, slot `slot` set to
// dF = f_new - f and dG = gy_new - gy, and the iteration's sums per channel c, products in T
// summed in double as the Triton record sums them:
//   sums[0][c] = sum_i f_new_ic^2,
//   sums[1 + j][c] = sum_i dF_j,ic dF_slot,ic,  sums[1 + count + j][c] = sum_i dF_j,ic f_new_ic
// for j < count (slot j = `slot` the new dF). Each chunk of rows sums its own table, the tables
// are added in chunk order (uniform_row_chunks: a function of n alone), so the sums are the
// same bits at any thread count.
template <typename T>
void anderson_record_t(const T* gy_new, const T* y_new, const T* f, const T* gy, T* f_new,
                       T* d_f, T* d_g, int64_t n, int64_t d, int64_t slot, int64_t count,
                       double* sums) {
  const int64_t slot_size = n * d;
  const int64_t width = (1 + 2 * count) * d;
  // one work unit per 16 channels read or written in a row (the window's count slots, five
  // more vectors), as a gathered 64-byte row is one unit of the CSR passes
  const RowChunks chunks = uniform_row_chunks(n, (count + 5) * d / 16 + 1);
  std::vector<double> parts(static_cast<size_t>(chunks.size() * width), 0.0);
  T* const new_df = d_f + slot * slot_size;
  T* const new_dg = d_g + slot * slot_size;
  parallel_for_rows(chunks, [&](int64_t chunk, int64_t row_begin, int64_t row_end) {
    double* const norm = parts.data() + chunk * width;
    for (int64_t i = row_begin; i < row_end; ++i) {
      const int64_t off = i * d;
      T* const fn = f_new + off;
      T* const df = new_df + off;
      for (int64_t c = 0; c < d; ++c) {
        const T g = gy_new[off + c];
        const T v = g - y_new[off + c];
        fn[c] = v;
        df[c] = v - f[off + c];
        new_dg[off + c] = g - gy[off + c];
        norm[c] += static_cast<double>(v * v);
      }
      for (int64_t j = 0; j < count; ++j) {
        const T* const x = d_f + j * slot_size + off;  // (slot j == slot: df itself)
        double* const gram_row = norm + (1 + j) * d;
        double* const rhs = norm + (1 + count + j) * d;
        for (int64_t c = 0; c < d; ++c) {
          gram_row[c] += static_cast<double>(x[c] * df[c]);
          rhs[c] += static_cast<double>(x[c] * fn[c]);
        }
      }
    }
  });
  std::fill(sums, sums + width, 0.0);
  for (int64_t chunk = 0; chunk < chunks.size(); ++chunk) {  // in chunk order
    const double* part = parts.data() + chunk * width;
    for (int64_t k = 0; k < width; ++k) sums[k] += part[k];
  }
}
