#ifndef CORE_OPS_KERNEL_UTIL_H_
#define CORE_OPS_KERNEL_UTIL_H_

// Shared pieces of the CPU kernels: argument checks with messages that name
// the op and the tensors, vectorised bf16/fp16 <-> fp32 conversion, a
// vectorisable exp, and the blocked parallel loop the elementwise kernels run
// in.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/half.h"
#include "core/tensor.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace mcc {
namespace ops {

// "fp32[4, 8]" (plus " on cuda:0" for non-CPU tensors), for error messages.
std::string Brief(const Tensor& t);

// A named tensor argument, for the checks below.
struct Arg {
  const char* name;
  const Tensor* tensor;
};

// Every tensor defined.
absl::Status CheckDefined(absl::string_view op,
                          std::initializer_list<Arg> args);
// Every tensor on the same device as the first.
absl::Status CheckSameDevice(absl::string_view op,
                             std::initializer_list<Arg> args);
// fp32, bf16 or fp16.
absl::Status CheckFloatDType(absl::string_view op, const Arg& arg);
// Exactly this dtype.
absl::Status CheckDType(absl::string_view op, const Arg& arg, DType dtype);
// Same shape as the reference tensor.
absl::Status CheckShapeMatches(absl::string_view op, const Arg& ref,
                               const Arg& arg);

// n elements between bf16 and fp32 (round to nearest even; NaN stays NaN).
void BF16ToF32(const BFloat16* src, float* dst, int64_t n);
void F32ToBF16(const float* src, BFloat16* dst, int64_t n);
// n elements between IEEE fp16 and fp32 (F16C; round to nearest even,
// overflow to infinity, subnormals kept).
void F16ToF32(const Float16* src, float* dst, int64_t n);
void F32ToF16(const float* src, Float16* dst, int64_t n);

inline void LoadF32(const float* src, float* dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
inline void LoadF32(const BFloat16* src, float* dst, int64_t n) {
  BF16ToF32(src, dst, n);
}
inline void LoadF32(const Float16* src, float* dst, int64_t n) {
  F16ToF32(src, dst, n);
}
inline void StoreF32(const float* src, float* dst, int64_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
inline void StoreF32(const float* src, BFloat16* dst, int64_t n) {
  F32ToBF16(src, dst, n);
}
inline void StoreF32(const float* src, Float16* dst, int64_t n) {
  F32ToF16(src, dst, n);
}

// All of an fp32, bf16 or fp16 CPU tensor's elements as fp32, in parallel.
void LoadF32Any(const Tensor& t, float* dst);

// exp(x) to about 2 ulp for |x| < 87, written without branches so the
// compiler vectorises loops that call it (Cephes' polynomial). For non-NaN
// x it is Exp8's lane bit for bit: each step is an explicit FMA or a lone
// operation, which FMA contraction (GCC's default with -mfma) cannot change.
inline float VecExp(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.7f ? 88.7f : x;
  // x * log2(e) rounded, then to the nearest integer (vroundps vectorises).
  const float fx = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(fx, -0.693359375f, x);
  r = std::fma(fx, 2.12194440e-4f, r);
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = std::fma(p, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r2, r) + 1.0f;
  int32_t e = static_cast<int32_t>(fx) + 127;
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// tanh(x) = 1 - 2 / (exp(2x) + 1), vectorisable.
inline float VecTanh(float x) {
  return 1.0f - 2.0f / (VecExp(2.0f * x) + 1.0f);
}

// One element as fp32.
inline float ToF32(float v) { return v; }
inline float ToF32(BFloat16 v) { return BFloat16ToFloat(v); }
inline float ToF32(Float16 v) { return Float16ToFloat(v); }

#if defined(__AVX2__)
// VecExp on 8 lanes.
inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)),
                    _mm256_set1_ps(88.7f));
  const __m256 fx =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(fx, _mm256_set1_ps(-0.693359375f), x);
  r = _mm256_fmadd_ps(fx, _mm256_set1_ps(2.12194440e-4f), r);
  const __m256 r2 = _mm256_mul_ps(r, r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// 8 elements as fp32 straight into a register: the fused elementwise loops
// convert in place instead of round-tripping through scratch buffers.
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8(const BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 Load8(const Float16* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void Store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
// The bf16 bits of 8 floats in the low half of each 32-bit lane: round to
// nearest even, NaN kept quiet, bit-identical to FloatToBFloat16.
inline __m256i BF16Bits8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)),
      16);
  const __m256i nan_bits = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(
      rounded, nan_bits,
      _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
inline void Store8(BFloat16* p, __m256 v) {
  const __m256i r = BF16Bits8(v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(r),
                                    _mm256_extracti128_si256(r, 1)));
}
inline void Store8(Float16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}
// The first n < 8 elements (the rest read as 0 / not written), for tails.
template <typename T>
inline __m256 LoadPartial8(const T* p, int64_t n) {
  alignas(32) float buf[8] = {};
  for (int64_t i = 0; i < n; ++i) buf[i] = ToF32(p[i]);
  return _mm256_load_ps(buf);
}
template <typename T>
inline void StorePartial8(T* p, __m256 v, int64_t n) {
  T buf[8];
  Store8(buf, v);
  for (int64_t i = 0; i < n; ++i) p[i] = buf[i];
}
// n elements from one float dtype to another (or a copy), through
// registers, rounding as the scalar conversions do.
template <typename TS, typename TD>
inline void ConvertInRegisters(const TS* src, TD* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) Store8(dst + i, Load8(src + i));
  if (i < n) StorePartial8(dst + i, LoadPartial8(src + i, n - i), n - i);
}

// Sixteen elements as two vectors, in one of two lane orders. kUnpacked is
// the order vpunpck{l,h}wd gives bf16 for free and vpackusdw undoes (lo =
// elements 0-3 and 8-11, hi = 4-7 and 12-15: 128-bit lanes never mix), so
// bf16 operands skip the widening shifts and cross-lane shuffles that made
// the 16-bit elementwise kernels slower than fp32 ones; fp32 and fp16
// operands pay one vperm2f128 per vector to match. An elementwise op loads
// and stores every operand in the same order, so each result lands where its
// inputs came from. kNatural (lo = 0-7, hi = 8-15) is for ops without bf16.
enum class Lanes16 { kNatural, kUnpacked };
template <typename... T>
constexpr Lanes16 kLanes16For = (std::is_same<T, BFloat16>::value || ...)
                                    ? Lanes16::kUnpacked
                                    : Lanes16::kNatural;

template <Lanes16 L, typename T>
inline void Load16(const T* p, __m256* lo, __m256* hi) {
  if constexpr (L == Lanes16::kUnpacked && std::is_same<T, BFloat16>::value) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i zero = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, w));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, w));
  } else {
    const __m256 a = Load8(p), b = Load8(p + 8);
    if constexpr (L == Lanes16::kNatural) {
      *lo = a;
      *hi = b;
    } else {
      *lo = _mm256_permute2f128_ps(a, b, 0x20);
      *hi = _mm256_permute2f128_ps(a, b, 0x31);
    }
  }
}

template <Lanes16 L, typename T>
inline void Store16(T* p, __m256 lo, __m256 hi) {
  if constexpr (L == Lanes16::kUnpacked && std::is_same<T, BFloat16>::value) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm256_packus_epi32(BF16Bits8(lo), BF16Bits8(hi)));
  } else if constexpr (L == Lanes16::kNatural) {
    Store8(p, lo);
    Store8(p + 8, hi);
  } else {
    Store8(p, _mm256_permute2f128_ps(lo, hi, 0x20));
    Store8(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
}

// The first n < 16 elements (the rest read as 0 / not written), for tails.
template <Lanes16 L, typename T>
inline void LoadPartial16(const T* p, int64_t n, __m256* lo, __m256* hi) {
  T buf[16] = {};
  std::memcpy(buf, p, n * sizeof(T));
  Load16<L>(buf, lo, hi);
}
template <Lanes16 L, typename T>
inline void StorePartial16(T* p, __m256 lo, __m256 hi, int64_t n) {
  T buf[16];
  Store16<L>(buf, lo, hi);
  std::memcpy(p, buf, n * sizeof(T));
}
// Per-column fp32 operands (a bias, its gradient's partial sums) are reused
// by every row: ShuffleLanes16 lays each whole 16-element chunk out in
// kUnpacked order (elements 0-3, 8-11, 4-7, 12-15; its own inverse), so that
// Load16<kNatural> / Store16<kNatural> (plain loads) move them in kUnpacked
// order without a vperm2f128 per vector per row. The last n % 16 elements
// stay in place.
inline void ShuffleLanes16(float* v, int64_t n) {
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    std::swap_ranges(v + i + 4, v + i + 8, v + i + 8);
  }
}

// n <= 16 elements: the whole-vector path for 16, the partial one below.
template <Lanes16 L, typename T>
inline void LoadUpTo16(const T* p, int64_t n, __m256* lo, __m256* hi) {
  if (n == 16) {
    Load16<L>(p, lo, hi);
  } else {
    LoadPartial16<L>(p, n, lo, hi);
  }
}
template <Lanes16 L, typename T>
inline void StoreUpTo16(T* p, __m256 lo, __m256 hi, int64_t n) {
  if (n == 16) {
    Store16<L>(p, lo, hi);
  } else {
    StorePartial16<L>(p, lo, hi, n);
  }
}
#endif

// Calls fn(float{}), fn(BFloat16{}) or fn(Float16{}) for an fp32, bf16 or
// fp16 dtype, so kernels template on the element type:
// DispatchFloat(t.dtype(), [&](auto tag) { using T = decltype(tag); ... }).
template <typename Fn>
void DispatchFloat(DType dtype, Fn&& fn) {
  if (dtype == DType::kBFloat16) {
    fn(BFloat16{});
  } else if (dtype == DType::kFloat16) {
    fn(Float16{});
  } else {
    fn(float{});
  }
}

// Kernels with several tensor arguments of independent dtypes would need 3^k
// instantiations under nested DispatchFloat. One op never mixes bf16 with
// fp16 (CheckOne16BitType refuses it), so they dispatch once on the op's
// 16-bit type H and then per tensor on {float, H}: 2^(k+1) instantiations.
// Dispatch16BitType calls fn(Float16{}) if any dtype is fp16, else
// fn(BFloat16{}); DispatchFloatOr<H> calls fn(float{}) or fn(H{}).
absl::Status CheckOne16BitType(absl::string_view op,
                               std::initializer_list<Arg> args);
template <typename Fn>
void Dispatch16BitType(std::initializer_list<DType> dtypes, Fn&& fn) {
  for (DType d : dtypes) {
    if (d == DType::kFloat16) {
      fn(Float16{});
      return;
    }
  }
  fn(BFloat16{});
}
template <typename H, typename Fn>
void DispatchFloatOr(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat32) {
    fn(float{});
  } else {
    fn(H{});
  }
}

// n inputs as fp32: p itself for fp32, else widened into buf.
inline const float* AsF32(const float* p, int64_t, float*) { return p; }
inline const float* AsF32(const BFloat16* p, int64_t n, float* buf) {
  BF16ToF32(p, buf, n);
  return buf;
}
inline const float* AsF32(const Float16* p, int64_t n, float* buf) {
  F16ToF32(p, buf, n);
  return buf;
}
// Where to compute n outputs in fp32: p itself for fp32, else buf; then
// FinishF32 narrows buf into p for bf16 and fp16.
inline float* OutF32(float* p, float*) { return p; }
inline float* OutF32(BFloat16*, float* buf) { return buf; }
inline float* OutF32(Float16*, float* buf) { return buf; }
inline void FinishF32(const float*, float*, int64_t) {}
inline void FinishF32(const float* buf, BFloat16* p, int64_t n) {
  F32ToBF16(buf, p, n);
}
inline void FinishF32(const float* buf, Float16* p, int64_t n) {
  F32ToF16(buf, p, n);
}

// Elements per block of the blocked elementwise loops (fits L1 for a few
// fp32 scratch arrays).
inline constexpr int64_t kBlock = 1024;
// Elements per parallel chunk: below this, threads cost more than they give.
inline constexpr int64_t kGrain = 32 * 1024;

// Calls fn(begin, end) over [0, n) on the global thread pool in chunks of at
// least kGrain elements (multiples of kBlock).
void ParallelForElements(int64_t n,
                         const std::function<void(int64_t, int64_t)>& fn);

// Calls fn(row_begin, row_end) over [0, rows) rows of `cols` elements each,
// with chunks of about kGrain elements.
void ParallelForRows(int64_t rows, int64_t cols,
                     const std::function<void(int64_t, int64_t)>& fn);

// Calls fn(offset, col, n) over [0, numel) in parallel, in pieces of at most
// kBlock elements that never cross a row of h elements: the piece covers
// flat elements [offset, offset + n), columns [col, col + n) of one row.
template <typename Fn>
void ForEachBlock(int64_t numel, int64_t h, const Fn& fn) {
  if (numel <= 0 || h <= 0) return;
  ParallelForElements(numel, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e;) {
      const int64_t col = i % h;
      int64_t n = e - i;
      if (n > kBlock) n = kBlock;
      if (n > h - col) n = h - col;
      fn(i, col, n);
      i += n;
    }
  });
}

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_KERNEL_UTIL_H_
