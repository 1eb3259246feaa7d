#include "core/ops/activation.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/avx512_util.h"
#include "core/ops/bias.h"
#include "core/ops/cpu_isa.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

// y = gelu(x (+ b)); b may be null.
inline float GeluF(float v) {
  const float t = VecTanh(kSqrt2OverPi * v * (1.0f + kGeluCoeff * v * v));
  return 0.5f * v * (1.0f + t);
}

inline float GeluGradF(float v) {
  const float v2 = v * v;
  const float t = VecTanh(kSqrt2OverPi * v * (1.0f + kGeluCoeff * v2));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * v2);
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

#if defined(__AVX2__)
// How closely 1 / (1 + 2^t) is computed, as a policy: kDegree, the degree
// of 2^f's polynomial, and Recip(d) ~ 1 / d. FullPrecision for fp32 and fp16
// results and every backward pass; Bf16Precision for bf16 forward results,
// where a degree-3 polynomial (one FMA fewer) is precise enough. The
// backward passes always use FullPrecision: their derivatives subtract nearly
// equal terms (gelu' near its zero at x = -0.75, silu' near a = -1.28), which
// would magnify the error past bf16's, and the bias gradient sums the
// unrounded fp32 values.
//
// Relative error of r = 1 / (1 + 2^t) before the callers' own roundings, for
// |t| <= 125 (t is clamped beyond, where r is within 2^-125 of 0 or 1):
// P (2^f's polynomial, evaluated in fp32) + u (1 + 2^t rounds once;
// u = 2^-24) + R (the reciprocal), plus ln(2) |dt| from the caller's error
// dt in t (2^t's scaling by 2^i is exact).
//   FullPrecision: P = 2.71e-6, R = u.
//   Bf16Precision: P = 7.54e-5, R = u: 7.55e-5 + ln(2) |dt| in all, under
//   a twentieth of the 2^-9 that keeps a bf16 result within one ulp of the
//   exact value (activation_test derives its tolerances from these bounds).
// R = u because the reciprocal is vdivps, correctly rounded on every CPU.
// vrcpps is documented only to a relative error of 1.5 * 2^-12 (3.7e-4) and
// vendors differ within that (Intel's parts near it, AMD's closer), so with
// it a bf16 result near a rounding midpoint rounded differently on Intel
// (issue 16). vrcpps plus one Newton step would square its bound (R =
// 2.25 u + u, tested through the seam below), but ran 10% slower than the
// division on the bench machine (Zen 5); raw vrcpps saved only 4%.
struct FullPrecision {
  static constexpr int kDegree = 4;
  static __m256 Recip(__m256 d) {
    return _mm256_div_ps(_mm256_set1_ps(1.0f), d);
  }
};

// vrcpps, as this CPU implements it.
struct HardwareRcp {
  static __m256 Rcp(__m256 d) { return _mm256_rcp_ps(d); }
};

// How Bf16Precision takes 1 / d: kDivide as shipped; kRcp (the path before
// issue 16) and kRcpNewton, with Approx standing in for vrcpps, only for
// the tests' seam (internal::GeluBf16PathForTesting).
enum class RecipMethod { kDivide, kRcp, kRcpNewton };
template <RecipMethod M = RecipMethod::kDivide, typename Approx = HardwareRcp>
struct Bf16Precision {
  static constexpr int kDegree = 3;
  static __m256 Recip(__m256 d) {
    const __m256 one = _mm256_set1_ps(1.0f);
    if constexpr (M == RecipMethod::kDivide) return _mm256_div_ps(one, d);
    const __m256 r = Approx::Rcp(d);
    if constexpr (M == RecipMethod::kRcp) return r;
    // r = (1 + e) / d: r + r (1 - d r) = (1 - e^2) / d, and the FMA that
    // forms 1 - d r = -e rounds only e's low bits.
    return _mm256_fmadd_ps(r, _mm256_fnmadd_ps(d, r, one), r);
  }
};

// The policy for results of type TY.
template <typename TY>
using PrecisionFor = std::conditional_t<std::is_same<TY, BFloat16>::value,
                                        Bf16Precision<>, FullPrecision>;

// r = 1 / (1 + 2^t), and 1 - r as 2^t r (no cancellation where r is near 1:
// the derivatives need both). 2^t = 2^i 2^f with i = round(t) by the
// 1.5 * 2^23 trick: i then sits in the low mantissa bits of t + 1.5 * 2^23,
// and shifting those bits into the exponent field and adding them to 2^f's
// bits scales by 2^i without a float multiply or conversion. 2^f on
// [-1/2, 1/2] is a minimax fit, fitted for this file: relative error at most
// 2.71e-6 (degree 4) or 7.54e-5 (degree 3), evaluated in fp32 as below,
// measured over every float f in [-1/2, 1/2]. Callers fold log2(e) into t's
// constants.
// The fits' coefficients, highest power first; the AVX2 and AVX-512 blocks
// both evaluate them by Horner's rule in fused multiply-adds.
constexpr float kExp2Degree4[] = {9.569964864e-3f, 5.591750652e-2f,
                                  2.402474477e-1f, 6.931218604e-1f,
                                  9.999992627e-1f};
constexpr float kExp2Degree3[] = {5.517024989e-2f, 2.426079015e-1f,
                                  6.932609265e-1f, 9.999282809e-1f};
template <int kDegree>
constexpr const float* Exp2Poly() {
  static_assert(kDegree == 3 || kDegree == 4,
                "2^f's polynomial has degree 3 or 4");
  return kDegree == 4 ? kExp2Degree4 : kExp2Degree3;
}

template <typename P>
inline __m256 RecipOnePlusExp2(__m256 t, __m256* one_minus) {
  // 2^i stays a normal float's scale and 1 + 2^t stays finite.
  t = _mm256_min_ps(_mm256_max_ps(t, _mm256_set1_ps(-125.0f)),
                    _mm256_set1_ps(126.0f));
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  const __m256 s = _mm256_add_ps(t, magic);
  const __m256 f = _mm256_sub_ps(t, _mm256_sub_ps(s, magic));
  const float* c = Exp2Poly<P::kDegree>();
  __m256 p = _mm256_set1_ps(c[0]);
  for (int k = 1; k <= P::kDegree; ++k) {
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[k]));
  }
  const __m256 e = _mm256_castsi256_ps(_mm256_add_epi32(
      _mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(s), 23)));
  const __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), e);
  const __m256 r = P::Recip(d);
  if (one_minus != nullptr) *one_minus = _mm256_mul_ps(e, r);
  return r;
}

// GELU's sigmoid(2u), u = sqrt(2/pi) (v + 0.044715 v^3), as 1 / (1 + 2^t)
// with t = v (kGeluT1 + kGeluT3 v^2) (log2(e) folded into the constants).
constexpr float kGeluT1 = -2.0f * kSqrt2OverPi * 1.4426950408889634f;
constexpr float kGeluT3 = kGeluT1 * kGeluCoeff;
template <typename P>
inline __m256 GeluSigmoid8(__m256 v, __m256* one_minus) {
  const __m256 t = _mm256_mul_ps(
      v, _mm256_fmadd_ps(_mm256_set1_ps(kGeluT3), _mm256_mul_ps(v, v),
                         _mm256_set1_ps(kGeluT1)));
  return RecipOnePlusExp2<P>(t, one_minus);
}

// 0.5 v (1 + tanh(u)) = v sigmoid(2u).
template <typename P>
inline __m256 Gelu8(__m256 v) {
  return _mm256_mul_ps(v, GeluSigmoid8<P>(v, nullptr));
}

// With s = sigmoid(2u): 0.5 (1 + tanh(u)) = s and
// 0.5 v (1 - tanh(u)^2) du/dv = 2 v s (1 - s) du/dv.
template <typename P>
inline __m256 GeluGrad8(__m256 v) {
  __m256 oms;
  const __m256 s = GeluSigmoid8<P>(v, &oms);
  const __m256 du =
      _mm256_mul_ps(_mm256_set1_ps(kSqrt2OverPi),
                    _mm256_fmadd_ps(_mm256_set1_ps(3.0f * kGeluCoeff),
                                    _mm256_mul_ps(v, v), _mm256_set1_ps(1.0f)));
  const __m256 sech = _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(v, v), s), oms);
  return _mm256_fmadd_ps(sech, du, s);
}

// sigmoid(a) = 1 / (1 + 2^(-a log2 e)).
template <typename P>
inline __m256 SigmoidAndComplement8(__m256 a, __m256* one_minus) {
  return RecipOnePlusExp2<P>(
      _mm256_mul_ps(a, _mm256_set1_ps(-1.4426950408889634f)), one_minus);
}

// The blocks below read and write their tensors' own dtypes 16 elements at a
// time, converting in registers (Load16 / Store16 in one lane order per op),
// so each element is read and written once; the tail of fewer than 16
// elements goes through the same vector code.

// Loads / stores 16 (or the last m < 16) per-column fp32 values in lane
// order L; `shuffled` (only ever set with L = kUnpacked, see ShuffleColumns):
// they are in ShuffleLanes16's layout, so whole chunks need plain loads.
template <Lanes16 L>
inline void LoadColumns16(const float* p, int64_t m, bool shuffled, __m256* lo,
                          __m256* hi) {
  if (shuffled && m == 16) {
    Load16<Lanes16::kNatural>(p, lo, hi);
  } else {
    LoadUpTo16<L>(p, m, lo, hi);
  }
}
template <Lanes16 L>
inline void StoreColumns16(float* p, __m256 lo, __m256 hi, int64_t m,
                           bool shuffled) {
  if (shuffled && m == 16) {
    Store16<Lanes16::kNatural>(p, lo, hi);
  } else {
    StoreUpTo16<L>(p, lo, hi, m);
  }
}

// x + b for 16 (or the last m < 16) elements, or x alone when b is null.
template <Lanes16 L, typename TX>
inline void LoadPlusBias16(const TX* x, const float* b, int64_t m,
                           bool b_shuffled, __m256* lo, __m256* hi) {
  LoadUpTo16<L>(x, m, lo, hi);
  if (b != nullptr) {
    __m256 blo, bhi;
    LoadColumns16<L>(b, m, b_shuffled, &blo, &bhi);
    *lo = _mm256_add_ps(*lo, blo);
    *hi = _mm256_add_ps(*hi, bhi);
  }
}

// y = gelu(x (+ b)); b may be null. `b_shuffled`: b is in ShuffleLanes16's
// layout (only with bf16 operands, in kUnpacked order).
template <typename P, typename TX, typename TY>
inline void GeluBlock(const TX* x, const float* b, bool b_shuffled, TY* y,
                      int64_t n) {
  constexpr Lanes16 L = kLanes16For<TX, TY>;
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t m = std::min<int64_t>(16, n - i);
    __m256 lo, hi;
    LoadPlusBias16<L>(x + i, b ? b + i : nullptr, m, b_shuffled, &lo, &hi);
    StoreUpTo16<L>(y + i, Gelu8<P>(lo), Gelu8<P>(hi), m);
  }
}

// dx = dy * gelu'(x (+ b)); with acc non-null also acc += dx (in fp32, before
// dx's rounding to its dtype), for the bias gradient.
// `cols_shuffled`: b and acc are in ShuffleLanes16's layout (as above).
template <typename TDY, typename TX, typename TDX>
inline void GeluGradBlock(const TDY* dy, const TX* x, const float* b, TDX* dx,
                          float* acc, bool cols_shuffled, int64_t n) {
  constexpr Lanes16 L = kLanes16For<TDY, TX, TDX>;
  using P = FullPrecision;  // see FullPrecision
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t m = std::min<int64_t>(16, n - i);
    __m256 glo, ghi, lo, hi;
    LoadUpTo16<L>(dy + i, m, &glo, &ghi);
    LoadPlusBias16<L>(x + i, b ? b + i : nullptr, m, cols_shuffled, &lo, &hi);
    const __m256 dlo = _mm256_mul_ps(glo, GeluGrad8<P>(lo));
    const __m256 dhi = _mm256_mul_ps(ghi, GeluGrad8<P>(hi));
    StoreUpTo16<L>(dx + i, dlo, dhi, m);
    if (acc != nullptr) {
      __m256 alo, ahi;
      LoadColumns16<L>(acc + i, m, cols_shuffled, &alo, &ahi);
      StoreColumns16<L>(acc + i, _mm256_add_ps(alo, dlo),
                        _mm256_add_ps(ahi, dhi), m, cols_shuffled);
    }
  }
}

// y = silu(a) * b.
template <typename P, typename TX, typename TY>
inline void SwiGLUBlock(const TX* a, const TX* b, TY* y, int64_t n) {
  constexpr Lanes16 L = kLanes16For<TX, TY>;
  auto f = [](__m256 av, __m256 bv) {
    return _mm256_mul_ps(
        _mm256_mul_ps(av, SigmoidAndComplement8<P>(av, nullptr)), bv);
  };
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t m = std::min<int64_t>(16, n - i);
    __m256 alo, ahi, blo, bhi;
    LoadUpTo16<L>(a + i, m, &alo, &ahi);
    LoadUpTo16<L>(b + i, m, &blo, &bhi);
    StoreUpTo16<L>(y + i, f(alo, blo), f(ahi, bhi), m);
  }
}

// da = g * b * silu'(a), db = g * silu(a); silu'(a) = s (1 + a (1 - s)).
template <typename TDY, typename TX, typename TDX>
inline void SwiGLUGradBlock(const TDY* g, const TX* a, const TX* b, TDX* da,
                            TDX* db, int64_t n) {
  constexpr Lanes16 L = kLanes16For<TDY, TX, TDX>;
  using P = FullPrecision;  // see FullPrecision
  const __m256 one = _mm256_set1_ps(1.0f);
  auto f = [&](__m256 gv, __m256 av, __m256 bv, __m256* dav, __m256* dbv) {
    __m256 oms;
    const __m256 s = SigmoidAndComplement8<P>(av, &oms);
    const __m256 dsilu = _mm256_mul_ps(s, _mm256_fmadd_ps(av, oms, one));
    *dav = _mm256_mul_ps(_mm256_mul_ps(gv, bv), dsilu);
    *dbv = _mm256_mul_ps(gv, _mm256_mul_ps(av, s));
  };
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t m = std::min<int64_t>(16, n - i);
    __m256 glo, ghi, alo, ahi, blo, bhi, dalo, dahi, dblo, dbhi;
    LoadUpTo16<L>(g + i, m, &glo, &ghi);
    LoadUpTo16<L>(a + i, m, &alo, &ahi);
    LoadUpTo16<L>(b + i, m, &blo, &bhi);
    f(glo, alo, blo, &dalo, &dblo);
    f(ghi, ahi, bhi, &dahi, &dbhi);
    StoreUpTo16<L>(da + i, dalo, dahi, m);
    StoreUpTo16<L>(db + i, dblo, dbhi, m);
  }
}

// 512-bit versions of the GELU and SwiGLU blocks, taken where KernelIsa() is
// kAvx512: each lane runs the 8-lane helpers' operations in the same order (the
// same division, no vrcpps), so the results are bit for bit the AVX2 blocks'
// (activation_test runs both). Operands stay in natural lane order: the
// widening and narrowing are one instruction each at this width, so the bias
// and its gradient's partial sums are never shuffled.
template <int kDegree>
MCC_AVX512_TARGET inline __m512 RecipOnePlusExp2x16(__m512 t,
                                                    __m512* one_minus) {
  t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(-125.0f)),
                    _mm512_set1_ps(126.0f));
  const __m512 magic = _mm512_set1_ps(12582912.0f);
  const __m512 s = _mm512_add_ps(t, magic);
  const __m512 f = _mm512_sub_ps(t, _mm512_sub_ps(s, magic));
  const float* c = Exp2Poly<kDegree>();
  __m512 p = _mm512_set1_ps(c[0]);
  for (int k = 1; k <= kDegree; ++k) {
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[k]));
  }
  const __m512 e = _mm512_castsi512_ps(_mm512_add_epi32(
      _mm512_castps_si512(p), _mm512_slli_epi32(_mm512_castps_si512(s), 23)));
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
  const __m512 r = _mm512_div_ps(_mm512_set1_ps(1.0f), d);
  if (one_minus != nullptr) *one_minus = _mm512_mul_ps(e, r);
  return r;
}

template <int kDegree>
MCC_AVX512_TARGET inline __m512 GeluSigmoid16(__m512 v, __m512* one_minus) {
  const __m512 t = _mm512_mul_ps(
      v, _mm512_fmadd_ps(_mm512_set1_ps(kGeluT3), _mm512_mul_ps(v, v),
                         _mm512_set1_ps(kGeluT1)));
  return RecipOnePlusExp2x16<kDegree>(t, one_minus);
}

template <int kDegree>
MCC_AVX512_TARGET inline __m512 Gelu16(__m512 v) {
  return _mm512_mul_ps(v, GeluSigmoid16<kDegree>(v, nullptr));
}

MCC_AVX512_TARGET inline __m512 GeluGrad16(__m512 v) {
  __m512 oms;
  const __m512 s = GeluSigmoid16<FullPrecision::kDegree>(v, &oms);
  const __m512 du =
      _mm512_mul_ps(_mm512_set1_ps(kSqrt2OverPi),
                    _mm512_fmadd_ps(_mm512_set1_ps(3.0f * kGeluCoeff),
                                    _mm512_mul_ps(v, v), _mm512_set1_ps(1.0f)));
  const __m512 sech = _mm512_mul_ps(_mm512_mul_ps(_mm512_add_ps(v, v), s), oms);
  return _mm512_fmadd_ps(sech, du, s);
}

// GeluBlock's result with 16 lanes (P's degree; P divides, as shipped).
template <typename P, typename TX, typename TY>
MCC_AVX512_TARGET void GeluBlock512(const TX* x, const float* b, TY* y,
                                    int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t m = std::min<int64_t>(16, n - i);
    __m512 v = LoadUpTo16F32(x + i, m);
    if (b != nullptr) v = _mm512_add_ps(v, LoadUpTo16F32(b + i, m));
    StoreUpTo16F32(y + i, Gelu16<P::kDegree>(v), m);
  }
}

// How far ahead the 512-bit GELU backward prefetches x and dy (as the SwiGLU
// blocks below do): bench bias_gelu.backward bf16 13.4-14.1 -> 15.7-16.2 GB/s
// on Zen 5 (the forward showed no change and has none). A hint only: results
// are unchanged.
constexpr int kGeluPrefetchBytes = 2048;

// GeluGradBlock's results with 16 lanes (acc in natural order).
template <typename TDY, typename TX, typename TDX>
MCC_AVX512_TARGET void GeluGradBlock512(const TDY* dy, const TX* x,
                                        const float* b, TDX* dx, float* acc,
                                        int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t m = std::min<int64_t>(16, n - i);
    _mm_prefetch(reinterpret_cast<const char*>(x + i) + kGeluPrefetchBytes,
                 _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(dy + i) + kGeluPrefetchBytes,
                 _MM_HINT_T0);
    __m512 v = LoadUpTo16F32(x + i, m);
    if (b != nullptr) v = _mm512_add_ps(v, LoadUpTo16F32(b + i, m));
    const __m512 d = _mm512_mul_ps(LoadUpTo16F32(dy + i, m), GeluGrad16(v));
    StoreUpTo16F32(dx + i, d, m);
    if (acc != nullptr) {
      StoreUpTo16F32(acc + i, _mm512_add_ps(LoadUpTo16F32(acc + i, m), d), m);
    }
  }
}

// SigmoidAndComplement8 on 16 lanes.
template <int kDegree>
MCC_AVX512_TARGET inline __m512 SigmoidAndComplement16(__m512 a,
                                                       __m512* one_minus) {
  return RecipOnePlusExp2x16<kDegree>(
      _mm512_mul_ps(a, _mm512_set1_ps(-1.4426950408889634f)), one_minus);
}

// How far ahead the 512-bit SwiGLU blocks prefetch each input stream.
// Without it the hardware prefetchers left the loads of a waiting on DRAM
// (perf: ~50% of the bf16 forward block's samples on them), a, b = a + h and
// y being several streams: bench swiglu bf16 forward 13.9 -> 20.5 GB/s,
// backward 18.5 -> 21.7 on Zen 5. A hint only: results are unchanged.
constexpr int kSwiGLUPrefetchBytes = 2048;

// SwiGLUBlock's result with 16 lanes (P's degree; P divides, as shipped).
template <typename P, typename TX, typename TY>
MCC_AVX512_TARGET void SwiGLUBlock512(const TX* a, const TX* b, TY* y,
                                      int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t m = std::min<int64_t>(16, n - i);
    _mm_prefetch(reinterpret_cast<const char*>(a + i) + kSwiGLUPrefetchBytes,
                 _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(b + i) + kSwiGLUPrefetchBytes,
                 _MM_HINT_T0);
    const __m512 av = LoadUpTo16F32(a + i, m);
    const __m512 bv = LoadUpTo16F32(b + i, m);
    const __m512 s = SigmoidAndComplement16<P::kDegree>(av, nullptr);
    StoreUpTo16F32(y + i, _mm512_mul_ps(_mm512_mul_ps(av, s), bv), m);
  }
}

// SwiGLUGradBlock's results with 16 lanes.
template <typename TDY, typename TX, typename TDX>
MCC_AVX512_TARGET void SwiGLUGradBlock512(const TDY* g, const TX* a,
                                          const TX* b, TDX* da, TDX* db,
                                          int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const int64_t m = std::min<int64_t>(16, n - i);
    _mm_prefetch(reinterpret_cast<const char*>(g + i) + kSwiGLUPrefetchBytes,
                 _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(a + i) + kSwiGLUPrefetchBytes,
                 _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(b + i) + kSwiGLUPrefetchBytes,
                 _MM_HINT_T0);
    const __m512 gv = LoadUpTo16F32(g + i, m);
    const __m512 av = LoadUpTo16F32(a + i, m);
    const __m512 bv = LoadUpTo16F32(b + i, m);
    __m512 oms;
    const __m512 s = SigmoidAndComplement16<FullPrecision::kDegree>(av, &oms);
    const __m512 dsilu = _mm512_mul_ps(s, _mm512_fmadd_ps(av, oms, one));
    StoreUpTo16F32(da + i, _mm512_mul_ps(_mm512_mul_ps(gv, bv), dsilu), m);
    StoreUpTo16F32(db + i, _mm512_mul_ps(gv, _mm512_mul_ps(av, s)), m);
  }
}

// Whether the shipped GELU and SwiGLU blocks run 16 lanes wide here.
bool GeluBlocks512() { return KernelIsa() == CpuIsa::kAvx512; }
#else
// Portable fallback: widen into fp32 scratch, compute, narrow (P unused).
struct FullPrecision {};
template <typename TY>
using PrecisionFor = FullPrecision;

template <typename P, typename TX, typename TY>
inline void GeluBlock(const TX* x, const float* b, bool /*b_shuffled*/, TY* y,
                      int64_t n) {
  float xbuf[kBlock], ybuf[kBlock];
  const float* xf = AsF32(x, n, xbuf);
  float* yf = OutF32(y, ybuf);
  for (int64_t i = 0; i < n; ++i) yf[i] = GeluF(b ? xf[i] + b[i] : xf[i]);
  FinishF32(yf, y, n);
}

template <typename TDY, typename TX, typename TDX>
inline void GeluGradBlock(const TDY* dy, const TX* x, const float* b, TDX* dx,
                          float* acc, bool /*cols_shuffled*/, int64_t n) {
  float xbuf[kBlock], dybuf[kBlock], dxbuf[kBlock];
  const float* xf = AsF32(x, n, xbuf);
  const float* dyf = AsF32(dy, n, dybuf);
  for (int64_t i = 0; i < n; ++i) {
    dxbuf[i] = dyf[i] * GeluGradF(b ? xf[i] + b[i] : xf[i]);
    if (acc) acc[i] += dxbuf[i];
  }
  StoreF32(dxbuf, dx, n);
}

template <typename P, typename TX, typename TY>
inline void SwiGLUBlock(const TX* a, const TX* b, TY* y, int64_t n) {
  float abuf[kBlock], bbuf[kBlock], ybuf[kBlock];
  const float* af = AsF32(a, n, abuf);
  const float* bf = AsF32(b, n, bbuf);
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + VecExp(-af[i]));
    ybuf[i] = af[i] * s * bf[i];
  }
  StoreF32(ybuf, y, n);
}

template <typename TDY, typename TX, typename TDX>
inline void SwiGLUGradBlock(const TDY* g, const TX* a, const TX* b, TDX* da,
                            TDX* db, int64_t n) {
  float gbuf[kBlock], abuf[kBlock], bbuf[kBlock], dabuf[kBlock], dbbuf[kBlock];
  const float* gf = AsF32(g, n, gbuf);
  const float* af = AsF32(a, n, abuf);
  const float* bf = AsF32(b, n, bbuf);
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + VecExp(-af[i]));
    dabuf[i] = gf[i] * bf[i] * s * (1.0f + af[i] * (1.0f - s));
    dbbuf[i] = gf[i] * af[i] * s;
  }
  StoreF32(dabuf, da, n);
  StoreF32(dbbuf, db, n);
}
#endif

absl::Status CheckUnary(const char* op, const char* xn, const Tensor& x,
                        const char* yn, const Tensor* y) {
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{xn, &x}, {yn, y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{xn, &x}, {yn, y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {xn, &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {yn, y}));
  return CheckShapeMatches(op, {xn, &x}, {yn, y});
}

// Whether an op on these element types takes its per-column fp32 operands
// (bias, bias-gradient partials) in ShuffleLanes16's layout: only the AVX2
// blocks with bf16 operands read them so, and only when h % 16 == 0, so that
// every 16-element chunk starts at a multiple of 16 within its row.
template <typename... T>
bool ShuffleColumns(int64_t h) {
#if defined(__AVX2__)
  return kLanes16For<T...> == Lanes16::kUnpacked && h % 16 == 0;
#else
  return false;
#endif
}

// Force, when not void, overrides the precision policy of y's dtype (the
// tests' seam, internal::GeluBf16PathForTesting).
template <typename Force, typename TY>
using PolicyFor =
    std::conditional_t<std::is_void<Force>::value, PrecisionFor<TY>, Force>;

// Forward GELU, with or without bias (bias32 null: fp32 [h], shuffled here
// for the bf16 blocks), on CPU tensors.
template <typename Force = void>
void GeluForwardCpu(const Tensor& x, std::vector<float>* bias32, Tensor* y) {
  const int64_t h = bias32 ? x.size(-1) : x.numel();
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(y->dtype(), [&](auto yt) {
      using TX = decltype(xt);
      using TY = decltype(yt);
      using P = PolicyFor<Force, TY>;
      const TX* xp = x.data<TX>();
      TY* yp = y->data<TY>();
      const float* bp = bias32 ? bias32->data() : nullptr;
#if defined(__AVX2__)
      if (std::is_void<Force>::value && GeluBlocks512()) {
        ForEachBlock(x.numel(), h, [&](int64_t off, int64_t col, int64_t n) {
          GeluBlock512<P>(xp + off, bp ? bp + col : nullptr, yp + off, n);
        });
        return;
      }
#endif
      const bool shuffled = bias32 != nullptr && ShuffleColumns<TX, TY>(h);
      if (shuffled) ShuffleLanes16(bias32->data(), h);
      ForEachBlock(x.numel(), h, [&](int64_t off, int64_t col, int64_t n) {
        GeluBlock<P>(xp + off, bp ? bp + col : nullptr, shuffled, yp + off, n);
      });
    });
  });
}

// dx = dy * gelu'(x).
void GeluBackwardCpu(const Tensor& dy, const Tensor& x, Tensor* dx) {
  const int64_t h = x.numel();
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(dy.dtype(), [&](auto dyt) {
      DispatchFloat(dx->dtype(), [&](auto dxt) {
        using TX = decltype(xt);
        using TDY = decltype(dyt);
        using TDX = decltype(dxt);
        const TX* xp = x.data<TX>();
        const TDY* dyp = dy.data<TDY>();
        TDX* dxp = dx->data<TDX>();
#if defined(__AVX2__)
        if (GeluBlocks512()) {
          ForEachBlock(x.numel(), h, [&](int64_t off, int64_t, int64_t n) {
            GeluGradBlock512(dyp + off, xp + off, nullptr, dxp + off, nullptr,
                             n);
          });
          return;
        }
#endif
        ForEachBlock(x.numel(), h, [&](int64_t off, int64_t col, int64_t n) {
          GeluGradBlock(dyp + off, xp + off, nullptr, dxp + off, nullptr, false,
                        n);
        });
      });
    });
  });
}

absl::Status GeluCpu(const Tensor& x, Tensor* y) {
  GeluForwardCpu(x, nullptr, y);
  return absl::OkStatus();
}

absl::Status GeluBackwardKernelCpu(const Tensor& dy, const Tensor& x,
                                   Tensor* dx) {
  GeluBackwardCpu(dy, x, dx);
  return absl::OkStatus();
}

absl::Status BiasGeluCpu(const Tensor& x, const Tensor& bias, Tensor* y) {
  std::vector<float> b32(bias.numel());
  LoadF32Any(bias, b32.data());
  GeluForwardCpu(x, &b32, y);
  return absl::OkStatus();
}

absl::Status BiasGeluBackwardCpu(const Tensor& dy, const Tensor& x,
                                 const Tensor& bias, Tensor* dx, Tensor* dbias);

}  // namespace

MCC_KERNEL_SLOT(UnaryKernel, GeluKernels, "Gelu", &GeluCpu);
MCC_KERNEL_SLOT(UnaryBackwardKernel, GeluBackwardKernels, "GeluBackward",
                &GeluBackwardKernelCpu);
MCC_KERNEL_SLOT(BiasGeluKernel, BiasGeluKernels, "BiasGelu", &BiasGeluCpu);
MCC_KERNEL_SLOT(BiasGeluBackwardKernel, BiasGeluBackwardKernels,
                "BiasGeluBackward", &BiasGeluBackwardCpu);

absl::Status Gelu(const Tensor& x, Tensor* y) {
  ScopedOpTimer op_timer("Gelu");
  MCC_RETURN_IF_ERROR(CheckUnary("Gelu", "x", x, "y", y));
  return GeluKernels()(x.device(), x, y);
}

absl::Status GeluBackward(const Tensor& dy, const Tensor& x, Tensor* dx) {
  ScopedOpTimer op_timer("GeluBackward");
  const char* op = "GeluBackward";
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "dx", dx));
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "dy", &dy));
  return GeluBackwardKernels()(x.device(), dy, x, dx);
}

absl::Status BiasGelu(const Tensor& x, const Tensor& bias, Tensor* y) {
  ScopedOpTimer op_timer("BiasGelu");
  const char* op = "BiasGelu";
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "y", y));
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"bias", &bias}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", &x}, {"bias", &bias}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"bias", &bias}));
  MCC_RETURN_IF_ERROR(internal::CheckBias(op, x, "x", bias));
  return BiasGeluKernels()(x.device(), x, bias, y);
}

absl::Status BiasGeluBackward(const Tensor& dy, const Tensor& x,
                              const Tensor& bias, Tensor* dx, Tensor* dbias) {
  ScopedOpTimer op_timer("BiasGeluBackward");
  const char* op = "BiasGeluBackward";
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "dx", dx));
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "dy", &dy));
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"bias", &bias}, {"dbias", dbias}}));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"x", &x}, {"bias", &bias}, {"dbias", dbias}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"bias", &bias}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"dbias", dbias}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(internal::CheckBias(op, x, "x", bias));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"bias", &bias}, {"dbias", dbias}));
  return BiasGeluBackwardKernels()(x.device(), dy, x, bias, dx, dbias);
}

namespace {

absl::Status BiasGeluBackwardCpu(const Tensor& dy, const Tensor& x,
                                 const Tensor& bias, Tensor* dx,
                                 Tensor* dbias) {
  std::vector<float> b32(bias.numel());
  LoadF32Any(bias, b32.data());
  const int64_t h = x.size(-1);
  const int64_t rows = h == 0 ? 0 : x.numel() / h;
  // One pass: each row's dx is computed in fp32 blocks, stored, and added
  // to its row group's partial bias gradient.
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(dy.dtype(), [&](auto dyt) {
      DispatchFloat(dx->dtype(), [&](auto dxt) {
        using TX = decltype(xt);
        using TDY = decltype(dyt);
        using TDX = decltype(dxt);
        const TX* xp = x.data<TX>();
        const TDY* dyp = dy.data<TDY>();
        TDX* dxp = dx->data<TDX>();
        // Bias and the partial sums in the bf16 blocks' layout: dbias is
        // accumulated in a shuffled copy (the same sums in the same order)
        // and put back in place at the end.
#if defined(__AVX2__)
        const bool wide = GeluBlocks512();
#else
        const bool wide = false;
#endif
        const bool shuffled = !wide && ShuffleColumns<TDY, TX, TDX>(h);
        std::vector<float> db_shuffled;
        float* db = dbias->data<float>();
        if (shuffled) {
          ShuffleLanes16(b32.data(), h);
          db_shuffled.assign(db, db + h);
          ShuffleLanes16(db_shuffled.data(), h);
          db = db_shuffled.data();
        }
        const float* bp = b32.data();
        internal::ForRowsWithColumnSums(
            rows, h,
            [&](int64_t r, float* acc) {
              for (int64_t j0 = 0; j0 < h; j0 += kBlock) {
                const int64_t n = std::min(kBlock, h - j0);
                const int64_t off = r * h + j0;
#if defined(__AVX2__)
                if (wide) {
                  GeluGradBlock512(dyp + off, xp + off, bp + j0, dxp + off,
                                   acc + j0, n);
                  continue;
                }
#endif
                GeluGradBlock(dyp + off, xp + off, bp + j0, dxp + off, acc + j0,
                              shuffled, n);
              }
            },
            db);
        if (shuffled) {
          ShuffleLanes16(db, h);
          std::copy(db, db + h, dbias->data<float>());
        }
      });
    });
  });
  return absl::OkStatus();
}

absl::Status CheckSwiGLU(const char* op, const Tensor& x, const char* yn,
                         const Tensor* y) {
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}, {yn, y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", &x}, {yn, y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {yn, y}));
  Shape want = x.shape();
  if (x.dim() < 1 || x.size(-1) % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", Brief(x), " and ", yn, " ", Brief(*y),
                     ": x's last dimension must be even (two halves)"));
  }
  want.back() /= 2;
  if (y->shape() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", Brief(x), " and ", yn, " ", Brief(*y), ": ",
                     yn, " should be ", ShapeToString(want)));
  }
  return absl::OkStatus();
}

// y = silu(a) * b over x = [a, b] on CPU tensors; Force as GeluForwardCpu's.
template <typename Force = void>
void SwiGLUForwardCpu(const Tensor& x, Tensor* y) {
  const int64_t h = y->size(-1);
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(y->dtype(), [&](auto yt) {
      using TX = decltype(xt);
      using TY = decltype(yt);
      using P = PolicyFor<Force, TY>;
      const TX* xp = x.data<TX>();
      TY* yp = y->data<TY>();
#if defined(__AVX2__)
      if (std::is_void<Force>::value && GeluBlocks512()) {
        ForEachBlock(y->numel(), h, [&](int64_t off, int64_t col, int64_t n) {
          const TX* a = xp + off / h * 2 * h + col;
          SwiGLUBlock512<P>(a, a + h, yp + off, n);
        });
        return;
      }
#endif
      ForEachBlock(y->numel(), h, [&](int64_t off, int64_t col, int64_t n) {
        const int64_t row = off / h;
        const TX* a = xp + row * 2 * h + col;
        SwiGLUBlock<P>(a, a + h, yp + off, n);
      });
    });
  });
}

absl::Status SwiGLUCpu(const Tensor& x, Tensor* y) {
  SwiGLUForwardCpu(x, y);
  return absl::OkStatus();
}

absl::Status SwiGLUBackwardCpu(const Tensor& dy, const Tensor& x, Tensor* dx);

}  // namespace

MCC_KERNEL_SLOT(UnaryKernel, SwiGLUKernels, "SwiGLU", &SwiGLUCpu);
MCC_KERNEL_SLOT(UnaryBackwardKernel, SwiGLUBackwardKernels, "SwiGLUBackward",
                &SwiGLUBackwardCpu);

absl::Status SwiGLU(const Tensor& x, Tensor* y) {
  ScopedOpTimer op_timer("SwiGLU");
  MCC_RETURN_IF_ERROR(CheckSwiGLU("SwiGLU", x, "y", y));
  return SwiGLUKernels()(x.device(), x, y);
}

absl::Status SwiGLUBackward(const Tensor& dy, const Tensor& x, Tensor* dx) {
  ScopedOpTimer op_timer("SwiGLUBackward");
  const char* op = "SwiGLUBackward";
  MCC_RETURN_IF_ERROR(CheckSwiGLU(op, x, "dy", &dy));
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"dx", dx}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"dx", dx}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", &x}, {"dx", dx}}));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"x", &x}, {"dx", dx}));
  return SwiGLUBackwardKernels()(x.device(), dy, x, dx);
}

namespace {

absl::Status SwiGLUBackwardCpu(const Tensor& dy, const Tensor& x, Tensor* dx) {
  const int64_t h = dy.size(-1);
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(dy.dtype(), [&](auto dyt) {
      DispatchFloat(dx->dtype(), [&](auto dxt) {
        using TX = decltype(xt);
        using TDY = decltype(dyt);
        using TDX = decltype(dxt);
        const TX* xp = x.data<TX>();
        const TDY* dyp = dy.data<TDY>();
        TDX* dxp = dx->data<TDX>();
#if defined(__AVX2__)
        if (GeluBlocks512()) {
          ForEachBlock(dy.numel(), h, [&](int64_t off, int64_t col, int64_t n) {
            const int64_t a_off = off / h * 2 * h + col, b_off = a_off + h;
            SwiGLUGradBlock512(dyp + off, xp + a_off, xp + b_off, dxp + a_off,
                               dxp + b_off, n);
          });
          return;
        }
#endif
        ForEachBlock(dy.numel(), h, [&](int64_t off, int64_t col, int64_t n) {
          const int64_t row = off / h;
          const int64_t a_off = row * 2 * h + col, b_off = a_off + h;
          SwiGLUGradBlock(dyp + off, xp + a_off, xp + b_off, dxp + a_off,
                          dxp + b_off, n);
        });
      });
    });
  });
  return absl::OkStatus();
}

}  // namespace

namespace internal {

#if defined(__AVX2__)
namespace {

// The documented bound's worst case, the same on every CPU:
// (1 / d) (1 + kSign 1.5 * 2^-12).
template <int kSign>
struct BoundRcp {
  static __m256 Rcp(__m256 d) {
    return _mm256_mul_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d),
                         _mm256_set1_ps(1.0f + kSign * 1.5f / 4096));
  }
};

// Calls fn(P{}) with the bf16 policy for these choices.
template <typename Fn>
void WithBf16Precision(Bf16RecipForTesting recip, RcpForTesting rcp, Fn&& fn) {
  auto with = [&](auto approx) {
    using A = decltype(approx);
    switch (recip) {
      case Bf16RecipForTesting::kShipped:
        return fn(Bf16Precision<>{});
      case Bf16RecipForTesting::kRcp:
        return fn(Bf16Precision<RecipMethod::kRcp, A>{});
      case Bf16RecipForTesting::kRcpNewton:
        return fn(Bf16Precision<RecipMethod::kRcpNewton, A>{});
    }
  };
  switch (rcp) {
    case RcpForTesting::kHardware:
      return with(HardwareRcp{});
    case RcpForTesting::kBoundLow:
      return with(BoundRcp<-1>{});
    case RcpForTesting::kBoundHigh:
      return with(BoundRcp<1>{});
  }
}

}  // namespace

absl::Status GeluBf16PathForTesting(const Tensor& x, const Tensor* bias,
                                    Tensor* y, Bf16RecipForTesting recip,
                                    RcpForTesting rcp) {
  const char* op = "GeluBf16PathForTesting";
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "y", y));
  std::vector<float> b32;
  if (bias != nullptr) {
    MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"bias", bias}));
    MCC_RETURN_IF_ERROR(CheckBias(op, x, "x", *bias));
    b32.resize(bias->numel());
    LoadF32Any(*bias, b32.data());
  }
  if (!x.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": CPU tensors only"));
  }
  WithBf16Precision(recip, rcp, [&](auto policy) {
    GeluForwardCpu<decltype(policy)>(x, bias ? &b32 : nullptr, y);
  });
  return absl::OkStatus();
}

absl::Status SwiGLUBf16PathForTesting(const Tensor& x, Tensor* y,
                                      Bf16RecipForTesting recip,
                                      RcpForTesting rcp) {
  const char* op = "SwiGLUBf16PathForTesting";
  MCC_RETURN_IF_ERROR(CheckSwiGLU(op, x, "y", y));
  if (!x.device().is_cpu()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": CPU tensors only"));
  }
  WithBf16Precision(recip, rcp, [&](auto policy) {
    SwiGLUForwardCpu<decltype(policy)>(x, y);
  });
  return absl::OkStatus();
}
#else
absl::Status GeluBf16PathForTesting(const Tensor&, const Tensor*, Tensor*,
                                    Bf16RecipForTesting, RcpForTesting) {
  return absl::UnimplementedError("GeluBf16PathForTesting: needs AVX2");
}
absl::Status SwiGLUBf16PathForTesting(const Tensor&, Tensor*,
                                      Bf16RecipForTesting, RcpForTesting) {
  return absl::UnimplementedError("SwiGLUBf16PathForTesting: needs AVX2");
}
#endif

}  // namespace internal

}  // namespace ops
}  // namespace mcc
