#ifndef CORE_OPS_AVX512_UTIL_H_
#define CORE_OPS_AVX512_UTIL_H_

// 512-bit versions of kernel_util's vector helpers, for kernels that carry an
// AVX-512 version beside the AVX2 one (taken where KernelIsa() is kAvx512;
// core/ops/cpu_isa.h). Each computes what its 8-lane counterpart computes,
// lane for lane and bit for bit, so a kernel may switch width without
// changing a result. Functions using them need MCC_AVX512_TARGET too.

#include <immintrin.h>

#include <cstdint>

#include "core/half.h"

#define MCC_AVX512_TARGET \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))

namespace mcc {
namespace ops {

// kernel_util's Exp8 on 16 lanes: the same operations in the same order.
MCC_AVX512_TARGET inline __m512 Exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)),
                    _mm512_set1_ps(88.7f));
  const __m512 fx = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(fx, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(fx, _mm512_set1_ps(2.12194440e-4f), r);
  const __m512 r2 = _mm512_mul_ps(r, r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

// 16 elements as fp32 (Load8's widening).
MCC_AVX512_TARGET inline __m512 Load16F32(const float* p) {
  return _mm512_loadu_ps(p);
}
MCC_AVX512_TARGET inline __m512 Load16F32(const BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
MCC_AVX512_TARGET inline __m512 Load16F32(const Float16* p) {
  return _mm512_cvtph_ps(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 16 floats stored as Store8 stores them: bf16 rounded to nearest even with
// NaN kept quiet (BF16Bits8's integer steps, FloatToBFloat16 bit for bit);
// fp16 by the conversion instruction, round to nearest even.
MCC_AVX512_TARGET inline void Store16F32(float* p, __m512 v) {
  _mm512_storeu_ps(p, v);
}
// The 16 bf16 results' bits (BF16Bits8 on 16 lanes), packed to 16 bits.
MCC_AVX512_TARGET inline __m256i BF16Bits16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i bits = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)),
      16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  bits = _mm512_mask_or_epi32(bits, nan, hi, _mm512_set1_epi32(0x0040));
  return _mm512_cvtepi32_epi16(bits);
}
MCC_AVX512_TARGET inline void Store16F32(BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), BF16Bits16(v));
}
MCC_AVX512_TARGET inline void Store16F32(Float16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

// The first n <= 16 elements (Load16F32 / Store16F32 for n = 16): masked
// loads read the rest as 0 without touching their memory, masked stores
// leave it unwritten. For kernels' row tails.
MCC_AVX512_TARGET inline __mmask16 FirstLanes16(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1);
}
MCC_AVX512_TARGET inline __m512 LoadUpTo16F32(const float* p, int64_t n) {
  return n == 16 ? Load16F32(p) : _mm512_maskz_loadu_ps(FirstLanes16(n), p);
}
MCC_AVX512_TARGET inline __m512 LoadUpTo16F32(const BFloat16* p, int64_t n) {
  if (n == 16) return Load16F32(p);
  const __m256i h = _mm256_maskz_loadu_epi16(FirstLanes16(n), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
MCC_AVX512_TARGET inline __m512 LoadUpTo16F32(const Float16* p, int64_t n) {
  if (n == 16) return Load16F32(p);
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(FirstLanes16(n), p));
}
MCC_AVX512_TARGET inline void StoreUpTo16F32(float* p, __m512 v, int64_t n) {
  if (n == 16) return Store16F32(p, v);
  _mm512_mask_storeu_ps(p, FirstLanes16(n), v);
}
MCC_AVX512_TARGET inline void StoreUpTo16F32(BFloat16* p, __m512 v, int64_t n) {
  if (n == 16) return Store16F32(p, v);
  _mm256_mask_storeu_epi16(p, FirstLanes16(n), BF16Bits16(v));
}
MCC_AVX512_TARGET inline void StoreUpTo16F32(Float16* p, __m512 v, int64_t n) {
  if (n == 16) return Store16F32(p, v);
  _mm256_mask_storeu_epi16(p, FirstLanes16(n),
                           _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_AVX512_UTIL_H_
