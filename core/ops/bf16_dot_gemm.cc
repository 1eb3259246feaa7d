#include "core/ops/bf16_dot_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace mcc {
namespace ops {
namespace {

#define MCC_AVX512_BF16 \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")))

// C[MR x n] with n <= 32: 16 columns per register, two registers per row.
template <int MR, bool kFull>
MCC_AVX512_BF16 inline void DotKernel(int64_t k, const BFloat16* a,
                                      int64_t a_row, int64_t a_pair,
                                      const BFloat16* b, int64_t ldb, float* c,
                                      int64_t ldc, int64_t n, bool accumulate) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    c0[r] = _mm512_setzero_ps();
    c1[r] = _mm512_setzero_ps();
  }
  const __mmask16 m0 =
      kFull ? 0xFFFF
            : static_cast<__mmask16>((1u << std::min<int64_t>(n, 16)) - 1);
  const __mmask16 m1 =
      kFull ? 0xFFFF
            : static_cast<__mmask16>((1u << std::max<int64_t>(n - 16, 0)) - 1);
  for (int64_t p = 0; p < k; p += 2) {
    const BFloat16* bp = b + (p / 2) * ldb;
    const __m512i b0 =
        kFull ? _mm512_loadu_si512(bp) : _mm512_maskz_loadu_epi32(m0, bp);
    const __m512i b1 = kFull ? _mm512_loadu_si512(bp + 32)
                             : _mm512_maskz_loadu_epi32(m1, bp + 32);
    const BFloat16* ap = a + 2 * (p / 2) * a_pair;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      int32_t word;
      std::memcpy(&word, ap + 2 * r * a_row, sizeof(word));
      const __m512i av = _mm512_set1_epi32(word);
      c0[r] = _mm512_dpbf16_ps(c0[r], (__m512bh)av, (__m512bh)b0);
      c1[r] = _mm512_dpbf16_ps(c1[r], (__m512bh)av, (__m512bh)b1);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    if (accumulate) {
      c0[r] = _mm512_add_ps(c0[r], _mm512_maskz_loadu_ps(m0, cr));
      c1[r] = _mm512_add_ps(c1[r], _mm512_maskz_loadu_ps(m1, cr + 16));
    }
    _mm512_mask_storeu_ps(cr, m0, c0[r]);
    _mm512_mask_storeu_ps(cr + 16, m1, c1[r]);
  }
}

template <bool kFull>
MCC_AVX512_BF16 void DotRowPanel(int64_t m, int64_t k, const BFloat16* a,
                                 int64_t a_row, int64_t a_pair,
                                 const BFloat16* b, int64_t ldb, float* c,
                                 int64_t ldc, int64_t n, bool acc) {
  int64_t i = 0;
  // 12-row tiles, but 16 or 13-15 rows left go as 8 + the rest, so that no
  // tile is left with too few accumulators to hide the instruction's latency.
  for (; i + 12 <= m && (m - i < 13 || m - i > 16); i += 12) {
    DotKernel<12, kFull>(k, a + 2 * i * a_row, a_row, a_pair, b, ldb,
                         c + i * ldc, ldc, n, acc);
  }
  if (m - i > 12) {
    DotKernel<8, kFull>(k, a + 2 * i * a_row, a_row, a_pair, b, ldb,
                        c + i * ldc, ldc, n, acc);
    i += 8;
  }
  const BFloat16* ai = a + 2 * i * a_row;
  float* ci = c + i * ldc;
  switch (m - i) {
#define MCC_ROWS_CASE(R)                                                \
  case R:                                                               \
    DotKernel<R, kFull>(k, ai, a_row, a_pair, b, ldb, ci, ldc, n, acc); \
    break;
    MCC_ROWS_CASE(11)
    MCC_ROWS_CASE(10)
    MCC_ROWS_CASE(9)
    MCC_ROWS_CASE(8)
    MCC_ROWS_CASE(7)
    MCC_ROWS_CASE(6)
    MCC_ROWS_CASE(5)
    MCC_ROWS_CASE(4)
    MCC_ROWS_CASE(3)
    MCC_ROWS_CASE(2)
    MCC_ROWS_CASE(1)
#undef MCC_ROWS_CASE
    default:
      break;
  }
}

}  // namespace

MCC_AVX512_BF16 void Bf16DotGemm(int64_t m, int64_t n, int64_t k,
                                 const BFloat16* a, int64_t a_row,
                                 int64_t a_pair, const BFloat16* b, int64_t ldb,
                                 float* c, int64_t ldc, bool accumulate) {
  for (int64_t j = 0; j < n; j += 32) {
    const int64_t nn = std::min<int64_t>(32, n - j);
    if (nn == 32) {
      DotRowPanel<true>(m, k, a, a_row, a_pair, b + 2 * j, ldb, c + j, ldc, 32,
                        accumulate);
    } else {
      DotRowPanel<false>(m, k, a, a_row, a_pair, b + 2 * j, ldb, c + j, ldc, nn,
                         accumulate);
    }
  }
}

namespace {

// The first n (up to 16) lanes.
inline __mmask16 Lanes16(int64_t n) {
  return static_cast<__mmask16>((1u << std::min<int64_t>(16, n)) - 1);
}

// The bf16 bits of 16 floats, each in the low half of a 32-bit lane.
MCC_AVX512_BF16 inline __m512i Bf16Lanes(__m512 v) {
  return _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v));
}

}  // namespace

MCC_AVX512_BF16 void RoundToBf16Rows(const float* src, int64_t lds,
                                     int64_t rows, int64_t cols, BFloat16* dst,
                                     int64_t ldd) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * lds;
    BFloat16* d = dst + r * ldd;
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m =
          static_cast<__mmask16>((1u << std::min<int64_t>(16, cols - c)) - 1);
      const __m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + c));
      _mm256_mask_storeu_epi16(d + c, m, (__m256i)h);
    }
    if (cols % 2 != 0) d[cols] = BFloat16{};
  }
}

MCC_AVX512_BF16 void RoundToBf16Pairs(const float* src, int64_t lds,
                                      int64_t rows, int64_t cols, BFloat16* dst,
                                      int64_t ldd) {
  for (int64_t r = 0; r < rows; r += 2) {
    const float* s0 = src + r * lds;
    const float* s1 = s0 + lds;
    const bool second = r + 1 < rows;
    uint32_t* d = reinterpret_cast<uint32_t*>(dst + (r / 2) * ldd);
    for (int64_t c = 0; c < cols; c += 16) {
      const __mmask16 m =
          static_cast<__mmask16>((1u << std::min<int64_t>(16, cols - c)) - 1);
      const __m512i lo = Bf16Lanes(_mm512_maskz_loadu_ps(m, s0 + c));
      const __m512i hi = second ? Bf16Lanes(_mm512_maskz_loadu_ps(m, s1 + c))
                                : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(d + c, m,
                               _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
  }
}

MCC_AVX512_BF16 void PackBf16RowPairs(const BFloat16* src, int64_t stride,
                                      int64_t rows, int64_t d, BFloat16* dst) {
  // 32 columns of two rows at a time: pair word x = row0[x] | row1[x] << 16,
  // interleaved by two 16-bit permutes.
  alignas(64) static const uint16_t kLow[32] = {
      0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i low = _mm512_load_si512(kLow);
  const __m512i high = _mm512_add_epi16(low, _mm512_set1_epi16(16));
  for (int64_t t = 0; t < rows; t += 2) {
    const BFloat16* s0 = src + t * stride;
    const BFloat16* s1 = s0 + stride;
    const bool second = t + 1 < rows;
    uint32_t* out = reinterpret_cast<uint32_t*>(dst + (t / 2) * 2 * d);
    for (int64_t x = 0; x < d; x += 32) {
      const int64_t n = std::min<int64_t>(32, d - x);
      const __mmask32 m = n == 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1;
      const __m512i r0 = _mm512_maskz_loadu_epi16(m, s0 + x);
      const __m512i r1 =
          second ? _mm512_maskz_loadu_epi16(m, s1 + x) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(out + x, Lanes16(n),
                               _mm512_permutex2var_epi16(r0, low, r1));
      if (n > 16) {
        _mm512_mask_storeu_epi32(out + x + 16, Lanes16(n - 16),
                                 _mm512_permutex2var_epi16(r0, high, r1));
      }
    }
  }
}

#undef MCC_AVX512_BF16

}  // namespace ops
}  // namespace mcc
