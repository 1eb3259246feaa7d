#include "core/ops/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/avx512_util.h"
#include "core/ops/bf16_dot_gemm.h"
#include "core/ops/cpu_isa.h"
#include "core/ops/dropout.h"
#include "core/ops/nn_internal.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "glog/logging.h"

namespace mcc {
namespace ops {
namespace {

using nn::Load8;
using nn::LoadS;

// Query rows and key columns per block. Equal, so a causal diagonal block
// always has at least one visible key per row.
constexpr int64_t kBlock = 64;

// Leading dimension of a transposed [d, n] panel: padded so its rows do not
// all fall into the same L1 sets when n is a power of two.
inline int64_t PaddedLd(int64_t n) { return (n + 15) / 16 * 16 + 16; }

// Lane masks: Mask(n) enables the first n (0..8) lanes.
inline __m256i Mask(int64_t n) {
  alignas(32) static const int32_t kTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1,
                                                 0,  0,  0,  0,  0,  0,  0,  0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kTable + 8 - n));
}

// Register-blocked micro-kernel: C[MR x n] (=|+=) A[MR x k] * B[k x n] with
// n <= 16, A(i, p) = a[i * a_rs + p * a_cs] (so A may be read transposed),
// B and C row-major.
template <int MR, bool kFull>
inline void MicroKernel(int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
                        const float* b, int64_t ldb, float* c, int64_t ldc,
                        int64_t n, bool accumulate) {
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    c0[r] = _mm256_setzero_ps();
    c1[r] = _mm256_setzero_ps();
  }
  const __m256i m0 = Mask(kFull ? 8 : std::min<int64_t>(n, 8));
  const __m256i m1 = Mask(kFull ? 8 : std::max<int64_t>(n - 8, 0));
  for (int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    const __m256 b0 = kFull ? _mm256_loadu_ps(bp) : _mm256_maskload_ps(bp, m0);
    const __m256 b1 =
        kFull ? _mm256_loadu_ps(bp + 8) : _mm256_maskload_ps(bp + 8, m1);
    const float* ap = a + p * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(ap + r * a_rs);
      c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    float* cr = c + r * ldc;
    if (kFull) {
      if (accumulate) {
        c0[r] = _mm256_add_ps(c0[r], _mm256_loadu_ps(cr));
        c1[r] = _mm256_add_ps(c1[r], _mm256_loadu_ps(cr + 8));
      }
      _mm256_storeu_ps(cr, c0[r]);
      _mm256_storeu_ps(cr + 8, c1[r]);
    } else {
      if (accumulate) {
        c0[r] = _mm256_add_ps(c0[r], _mm256_maskload_ps(cr, m0));
        c1[r] = _mm256_add_ps(c1[r], _mm256_maskload_ps(cr + 8, m1));
      }
      _mm256_maskstore_ps(cr, m0, c0[r]);
      _mm256_maskstore_ps(cr + 8, m1, c1[r]);
    }
  }
}

template <bool kFull>
void RowPanel(int64_t m, int64_t k, const float* a, int64_t a_rs, int64_t a_cs,
              const float* b, int64_t ldb, float* c, int64_t ldc, int64_t n,
              bool acc) {
  int64_t i = 0;
  for (; i + 6 <= m; i += 6) {
    MicroKernel<6, kFull>(k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc, ldc,
                          n, acc);
  }
  const float* ai = a + i * a_rs;
  float* ci = c + i * ldc;
  switch (m - i) {
    case 5:
      MicroKernel<5, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, n, acc);
      break;
    case 4:
      MicroKernel<4, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, n, acc);
      break;
    case 3:
      MicroKernel<3, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, n, acc);
      break;
    case 2:
      MicroKernel<2, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, n, acc);
      break;
    case 1:
      MicroKernel<1, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, n, acc);
      break;
    default:
      break;
  }
}

// The same micro-kernel with 512-bit vectors: C[MR x n] with n <= 32. Each
// element is the same chain of FMAs over p as in MicroKernel (then one add
// of the old C when accumulating), so both give bit-identical results.
#define MCC_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))
template <int MR, bool kFull>
MCC_AVX512 inline void MicroKernel512(int64_t k, const float* a, int64_t a_rs,
                                      int64_t a_cs, const float* b, int64_t ldb,
                                      float* c, int64_t ldc, int64_t n,
                                      bool accumulate) {
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
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
  for (int64_t p = 0; p < k; ++p) {
    const float* bp = b + p * ldb;
    const __m512 b0 =
        kFull ? _mm512_loadu_ps(bp) : _mm512_maskz_loadu_ps(m0, bp);
    const __m512 b1 =
        kFull ? _mm512_loadu_ps(bp + 16) : _mm512_maskz_loadu_ps(m1, bp + 16);
    const float* ap = a + p * a_cs;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(ap[r * a_rs]);
      c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
    }
  }
#pragma GCC unroll 8
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
MCC_AVX512 void RowPanel512(int64_t m, int64_t k, const float* a, int64_t a_rs,
                            int64_t a_cs, const float* b, int64_t ldb, float* c,
                            int64_t ldc, int64_t n, bool acc) {
  int64_t i = 0;
  for (; i + 8 <= m; i += 8) {
    MicroKernel512<8, kFull>(k, a + i * a_rs, a_rs, a_cs, b, ldb, c + i * ldc,
                             ldc, n, acc);
  }
  const float* ai = a + i * a_rs;
  float* ci = c + i * ldc;
  switch (m - i) {
#define MCC_ROWS_CASE(R)                                                  \
  case R:                                                                 \
    MicroKernel512<R, kFull>(k, ai, a_rs, a_cs, b, ldb, ci, ldc, n, acc); \
    break;
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

MCC_AVX512 void BlockGemm512(int64_t m, int64_t n, int64_t k, const float* a,
                             int64_t a_rs, int64_t a_cs, const float* b,
                             int64_t ldb, float* c, int64_t ldc,
                             bool accumulate) {
  for (int64_t j = 0; j < n; j += 32) {
    const int64_t nn = std::min<int64_t>(32, n - j);
    if (nn == 32) {
      RowPanel512<true>(m, k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, 32,
                        accumulate);
    } else {
      RowPanel512<false>(m, k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, nn,
                         accumulate);
    }
  }
}
#undef MCC_AVX512

// C[m x n] (=|+=) A[m x k] * B[k x n] for the small blocks of attention,
// in 512-bit vectors where the CPU has them (same results either way).
void BlockGemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs,
               int64_t a_cs, const float* b, int64_t ldb, float* c, int64_t ldc,
               bool accumulate) {
  if (KernelIsa() == CpuIsa::kAvx512) {
    BlockGemm512(m, n, k, a, a_rs, a_cs, b, ldb, c, ldc, accumulate);
    return;
  }
  for (int64_t j = 0; j < n; j += 16) {
    const int64_t nn = std::min<int64_t>(16, n - j);
    if (nn == 16) {
      RowPanel<true>(m, k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, 16,
                     accumulate);
    } else {
      RowPanel<false>(m, k, a, a_rs, a_cs, b + j, ldb, c + j, ldc, nn,
                      accumulate);
    }
  }
}

// src rows [rows, d] at row stride `stride` (elements) -> dst [rows, d] fp32.
template <typename T>
void PackRows(const T* src, int64_t stride, int64_t rows, int64_t d,
              float scale, float* dst) {
  for (int64_t t = 0; t < rows; ++t)
    nn::ToF32(src + t * stride, dst + t * d, d, scale);
}

// src rows [rows, d] at row stride `stride` -> dst [d, ld] fp32 (transposed).
template <typename T>
void PackTransposed(const T* src, int64_t stride, int64_t rows, int64_t d,
                    float* dst, int64_t ld) {
  for (int64_t t0 = 0; t0 < rows; t0 += 8) {
    const int64_t t1 = std::min(rows, t0 + 8);
    for (int64_t x = 0; x < d; ++x) {
      for (int64_t t = t0; t < t1; ++t)
        dst[x * ld + t] = LoadS(src + t * stride + x);
    }
  }
}

// Softmax numerators of one score row in place: row[c] = exp(row[c] - sub)
// for c < valid, 0 for valid <= c < n. Returns the sum over c < valid.
// The row must have room for n rounded up to 8.
inline float ExpRow(float* row, int64_t valid, int64_t n, float sub) {
  const __m256 vs = _mm256_set1_ps(sub);
  __m256 acc = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= valid; c += 8) {
    const __m256 e = nn::Exp8(_mm256_sub_ps(_mm256_loadu_ps(row + c), vs));
    _mm256_storeu_ps(row + c, e);
    acc = _mm256_add_ps(acc, e);
  }
  if (c < valid) {
    const __m256 keep = _mm256_castsi256_ps(Mask(valid - c));
    __m256 e = nn::Exp8(_mm256_sub_ps(_mm256_loadu_ps(row + c), vs));
    e = _mm256_and_ps(e, keep);
    _mm256_storeu_ps(row + c, e);
    acc = _mm256_add_ps(acc, e);
    c += 8;
  }
  for (; c < n; ++c) row[c] = 0.0f;
  return nn::HSum(acc);
}

// ExpRow over the keys [begin, end) of the row (0 outside, up to n), for
// rows whose document or window starts inside the block; returns the lane
// sums. Masked loads and stores keep it within the row.
inline __m256 ExpRangeLanes(float* row, int64_t begin, int64_t end, int64_t n,
                            float sub) {
  std::fill(row, row + begin, 0.0f);
  const __m256 vs = _mm256_set1_ps(sub);
  __m256 acc = _mm256_setzero_ps();
  int64_t c = begin;
  for (; c + 8 <= end; c += 8) {
    const __m256 e = nn::Exp8(_mm256_sub_ps(_mm256_loadu_ps(row + c), vs));
    _mm256_storeu_ps(row + c, e);
    acc = _mm256_add_ps(acc, e);
  }
  if (c < end) {
    const __m256i m = Mask(end - c);
    __m256 e = nn::Exp8(_mm256_sub_ps(_mm256_maskload_ps(row + c, m), vs));
    e = _mm256_and_ps(e, _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(row + c, m, e);
    acc = _mm256_add_ps(acc, e);
  }
  std::fill(row + end, row + n, 0.0f);
  return acc;
}

// The same, summed; rows starting at key 0 take ExpRow.
inline float ExpRange(float* row, int64_t begin, int64_t end, int64_t n,
                      float sub) {
  if (begin == 0) return ExpRow(row, end, n, sub);
  return nn::HSum(ExpRangeLanes(row, begin, end, n, sub));
}

struct Dims {
  int64_t b, s, hq, hkv, d;
  float scale;
  bool causal;
  // Attention dropout (see AttentionOptions).
  float dropout_p = 0.0f;
  uint64_t seed = 0, offset = 0;
  int64_t head_offset = 0, total_heads = 0;
  // AttentionOptions::first_key's data ([b, s]); null without.
  const int32_t* first_key = nullptr;
};

// Multiplies row[c] (c < n) by keep / (1 - p) for query row i of head h,
// keys j0.. of batch entry bi, drawing the words as AttentionOptions says.
inline void DropRow(const Dims& dm, int64_t bi, int64_t h, int64_t i,
                    int64_t j0, int64_t n, float* row, uint32_t* words) {
  if (n <= 0) return;
  const uint64_t first =
      dm.offset +
      ((static_cast<uint64_t>(bi) * dm.total_heads + dm.head_offset + h) *
           dm.s +
       i) *
          dm.s +
      j0;
  PhiloxStream(dm.seed, first, n, words);
  const uint32_t threshold =
      static_cast<uint32_t>(std::lround(dm.dropout_p * 16777216.0));
  const float scale = 1.0f / (1.0f - dm.dropout_p);
  for (int64_t c = 0; c < n; ++c) {
    row[c] = (words[c] >> 8) >= threshold ? row[c] * scale : 0.0f;
  }
}

// Keys [begin, end) of the key block starting at j0 (bc keys) that query
// row `row` of batch entry bi sees; begin == end when none.
struct KeyRange {
  int64_t begin, end;
  bool empty() const { return begin >= end; }
};
inline KeyRange Visible(const Dims& dm, int64_t bi, int64_t row, int64_t j0,
                        int64_t bc) {
  KeyRange r{0, bc};
  if (dm.causal) r.end = std::max<int64_t>(0, std::min(bc, row - j0 + 1));
  if (dm.first_key != nullptr) {
    r.begin = std::min<int64_t>(
        r.end, std::max<int64_t>(0, dm.first_key[bi * dm.s + row] - j0));
  }
  return r;
}

// The backward's dropout on one block of br query rows (from i0) by bc keys
// (from j0): the kept-and-rescaled mask of each row, zero outside the keys
// the row sees, turns dP into dS = P * (dP * mask - D) in place and P into
// the dropped P the value gradient takes. mask and words: kBlock scratch.
void DropoutBlockGrads(const Dims& dm, int64_t bi, int64_t h, int64_t i0,
                       int64_t j0, int64_t br, int64_t bc, const float* drow,
                       float* pb, float* dsb, float* mask, uint32_t* words) {
  for (int64_t r = 0; r < br; ++r) {
    float* p = pb + r * kBlock;
    float* ds = dsb + r * kBlock;
    const KeyRange vis = Visible(dm, bi, i0 + r, j0, bc);
    std::fill(mask, mask + kBlock, 1.0f);
    DropRow(dm, bi, h, i0 + r, j0 + vis.begin, vis.end - vis.begin,
            mask + vis.begin, words);
    for (int64_t c = 0; c < bc; ++c) {
      const float m = c >= vis.begin && c < vis.end ? mask[c] : 0.0f;
      ds[c] = p[c] * (ds[c] * m - drow[i0 + r]);
      p[c] *= m;
    }
  }
}

// The smallest first key of query rows [i0, i0 + br) of batch entry bi (0
// without a first_key): key blocks ending at or below it are skipped whole.
inline int64_t FirstKeyOfBlock(const Dims& dm, int64_t bi, int64_t i0,
                               int64_t br) {
  if (dm.first_key == nullptr) return 0;
  const int32_t* f = dm.first_key + bi * dm.s + i0;
  return std::max<int64_t>(0, *std::min_element(f, f + br));
}

// ---- The forward's online softmax over one block of scores, written once
// for the fp32 kernels and the bf16 dot-product path. Row r of the block
// (scores S, row stride kBlock) takes the keys [begin, end) it sees:
//   m = max(m_old, max S),  alpha = exp(m_old - m),  P = exp(S - m),
//   l = l_old alpha + sum P,  O *= alpha,
// and a row that sees none keeps m, l and O and gets P = 0. Rows go
// kLanes at a time so that their maxima, sums and alphas are vectors: one
// shuffle reduction serves them all instead of a serial one per row. The
// lane policies fix the numerics: SoftmaxLanes8 is the fp32 kernels' (AVX2,
// 8 lanes: Exp8, RowMax's and HSum's order; the same results on every ISA),
// SoftmaxLanes16 the bf16 path's (AVX-512: Exp16, _mm512_reduce_*_ps's
// order). OnlineSoftmaxBlock8/16 are always inlined, and the 16-lane one only
// into AVX-512 functions, so that the policy's intrinsics inline there too.

inline __mmask16 Lanes(int64_t n) {
  return static_cast<__mmask16>((1u << std::min<int64_t>(16, n)) - 1);
}

struct SoftmaxLanes8 {
  using Vec = __m256;
  static constexpr int kLanes = 8;
  static Vec Broadcast(float x) { return _mm256_set1_ps(x); }
  static Vec Max(Vec a, Vec b) { return _mm256_max_ps(a, b); }
  static Vec Sub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
  static Vec Exp(Vec x) { return nn::Exp8(x); }
  static Vec Fma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
  static Vec LoadFirst(const float* p, int n) {
    return _mm256_maskload_ps(p, Mask(n));
  }
  static void ToArray(float* p, Vec v) { _mm256_storeu_ps(p, v); }
  // RowMax's vector part: whole chunks of 8 (scores already scaled).
  static Vec ScaleAndMax(float* row, int64_t begin, int64_t end,
                         float /*scale*/) {
    __m256 m = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t c = begin; c + 8 <= end; c += 8) {
      m = _mm256_max_ps(m, _mm256_loadu_ps(row + c));
    }
    return m;
  }
  // ... and its scalar part: the rest one by one.
  static float MaxTail(float mx, const float* row, int64_t begin, int64_t end) {
    for (int64_t c = begin + (end - begin) / 8 * 8; c < end; ++c) {
      mx = std::max(mx, row[c]);
    }
    return mx;
  }
  // ExpRange: P in place (0 outside [begin, end) up to bc), lane sums.
  static Vec ExpRow(float* row, int64_t begin, int64_t end, int64_t bc,
                    float sub, BFloat16* /*prow*/) {
    return ExpRangeLanes(row, begin, end, bc, sub);
  }
  static void ScaleRow(float* o, int64_t d, float alpha) {
    for (int64_t x = 0; x < d; ++x) o[x] *= alpha;
  }
  // Lane r: HSum (kMax: HMax) of v[r], in the same order and operand order.
  template <bool kMax>
  static Vec Combine(Vec a, Vec b) {
    return kMax ? _mm256_max_ps(a, b) : _mm256_add_ps(a, b);
  }
  template <bool kMax>
  static Vec ReduceRows(const Vec* v) {
    // Lanes j and j + 4 (low half first): rows 2k, 2k + 1 in w[k]'s halves.
    __m256 w[4], x[2];
    for (int k = 0; k < 4; ++k) {
      w[k] =
          Combine<kMax>(_mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x20),
                        _mm256_permute2f128_ps(v[2 * k], v[2 * k + 1], 0x31));
    }
    // j and j + 2: in half H of x[k], lanes 0-1 row 4k + H, 2-3 4k + 2 + H.
    for (int k = 0; k < 2; ++k) {
      x[k] = Combine<kMax>(_mm256_shuffle_ps(w[2 * k], w[2 * k + 1], 0x44),
                           _mm256_shuffle_ps(w[2 * k], w[2 * k + 1], 0xEE));
    }
    // j and j + 1: half H lane t holds row 2t + H; put row r in lane r.
    const __m256 z = Combine<kMax>(_mm256_shuffle_ps(x[0], x[1], 0x88),
                                   _mm256_shuffle_ps(x[0], x[1], 0xDD));
    return _mm256_permutevar8x32_ps(z,
                                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }
};

#define MCC_AVX512_LANES MCC_AVX512_TARGET inline
struct SoftmaxLanes16 {
  using Vec = __m512;
  static constexpr int kLanes = 16;
  MCC_AVX512_LANES static Vec Broadcast(float x) { return _mm512_set1_ps(x); }
  MCC_AVX512_LANES static Vec Max(Vec a, Vec b) { return _mm512_max_ps(a, b); }
  MCC_AVX512_LANES static Vec Sub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
  MCC_AVX512_LANES static Vec Exp(Vec x) { return Exp16(x); }
  MCC_AVX512_LANES static Vec Fma(Vec a, Vec b, Vec c) {
    return _mm512_fmadd_ps(a, b, c);
  }
  MCC_AVX512_LANES static Vec LoadFirst(const float* p, int n) {
    return _mm512_maskz_loadu_ps(Lanes(n), p);
  }
  MCC_AVX512_LANES static void ToArray(float* p, Vec v) {
    _mm512_storeu_ps(p, v);
  }
  // Scores scaled in place; the largest in chunks of 16 from begin.
  MCC_AVX512_LANES static Vec ScaleAndMax(float* row, int64_t begin,
                                          int64_t end, float scale) {
    const __m512 s = _mm512_set1_ps(scale);
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t c = begin; c < end; c += 16) {
      const __mmask16 m = Lanes(end - c);
      const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, row + c), s);
      _mm512_mask_storeu_ps(row + c, m, v);
      mx = _mm512_mask_max_ps(mx, m, mx, v);
    }
    return mx;
  }
  static float MaxTail(float mx, const float*, int64_t, int64_t) { return mx; }
  // P = exp(S - sub) on [begin, end): into prow in bf16 (zero to the even
  // count) or, without prow, in place (0 on the rest of [0, bc)).
  __attribute__((target(
      "avx512f,avx512vl,avx512bw,avx512dq,avx512bf16"))) inline static Vec
  ExpRow(float* row, int64_t begin, int64_t end, int64_t bc, float sub,
         BFloat16* prow) {
    const __m256i zero = _mm256_setzero_si256();
    const int64_t n_even = (bc + 1) / 2 * 2;
    if (prow != nullptr) {
      for (int64_t c = 0; c < begin; c += 16) {
        _mm256_mask_storeu_epi16(prow + c, Lanes(begin - c), zero);
      }
    } else {
      std::fill(row, row + begin, 0.0f);
    }
    const __m512 vs = _mm512_set1_ps(sub);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t c = begin; c < end; c += 16) {
      const __mmask16 m = Lanes(end - c);
      const __m512 e =
          Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, row + c), vs));
      acc = _mm512_mask_add_ps(acc, m, acc, e);
      if (prow != nullptr) {
        _mm256_mask_storeu_epi16(prow + c, m, (__m256i)_mm512_cvtneps_pbh(e));
      } else {
        _mm512_mask_storeu_ps(row + c, m, e);
      }
    }
    if (prow != nullptr) {
      for (int64_t c = end; c < n_even; c += 16) {
        _mm256_mask_storeu_epi16(prow + c, Lanes(n_even - c), zero);
      }
    } else {
      std::fill(row + end, row + bc, 0.0f);
    }
    return acc;
  }
  MCC_AVX512_LANES static void ScaleRow(float* o, int64_t d, float alpha) {
    const __m512 a = _mm512_set1_ps(alpha);
    for (int64_t x = 0; x < d; x += 16) {
      const __mmask16 m = Lanes(d - x);
      _mm512_mask_storeu_ps(o + x, m,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(m, o + x), a));
    }
  }
  // Lane r: _mm512_reduce_add_ps (kMax: _max_ps) of v[r], in its order and
  // operand order (halves of 8, 4, 2, then 1 lanes).
  template <bool kMax>
  MCC_AVX512_LANES static Vec Combine(Vec a, Vec b) {
    return kMax ? _mm512_max_ps(a, b) : _mm512_add_ps(a, b);
  }
  template <bool kMax>
  MCC_AVX512_LANES static Vec ReduceRows(const Vec* v) {
    // Lanes j + 8 and j: rows 2k, 2k + 1 in the halves of w[k].
    __m512 w[8], x[4], y[2];
    for (int k = 0; k < 8; ++k) {
      w[k] = Combine<kMax>(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE),
                           _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44));
    }
    // j + 4 and j: row 4k + q in quarter q of x[k].
    for (int k = 0; k < 4; ++k) {
      x[k] = Combine<kMax>(_mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0xDD),
                           _mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0x88));
    }
    // j and j + 2: quarter q of y[k], lanes 0-1 row 8k + q, 2-3 8k + 4 + q.
    for (int k = 0; k < 2; ++k) {
      y[k] = Combine<kMax>(_mm512_shuffle_ps(x[2 * k], x[2 * k + 1], 0x44),
                           _mm512_shuffle_ps(x[2 * k], x[2 * k + 1], 0xEE));
    }
    // j and j + 1: lane 4q + t holds row 4t + q; put row r in lane r.
    const __m512 z = Combine<kMax>(_mm512_shuffle_ps(y[0], y[1], 0x88),
                                   _mm512_shuffle_ps(y[0], y[1], 0xDD));
    return _mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
        z);
  }
};
#undef MCC_AVX512_LANES

// The online softmax of one block (br x bc, row stride kBlock) in place:
// scales the scores by dm.scale first when scale_scores (the fp32 kernels
// scale q instead); updates mrow, lrow and oacc's rows; leaves P in sc, or
// with pb rounded to bf16 in pb (row stride kBlock), dropped after the sum
// with dropout (the normaliser counts every probability).
// OnlineSoftmaxBlock8 (the fp32 kernels) and OnlineSoftmaxBlock16 (the bf16
// dot path, AVX-512 only) from one text: online_softmax_block.inc.
#define MCC_ONLINE_SOFTMAX_NAME OnlineSoftmaxBlock8
#define MCC_ONLINE_SOFTMAX_LANES SoftmaxLanes8
#define MCC_ONLINE_SOFTMAX_TARGET
#include "core/ops/online_softmax_block.inc"

template <typename TQ, typename TO>
void ForwardCpu(const Dims& dm, const TQ* q, const TQ* k, const TQ* v, TO* out,
                float* lse) {
  const int64_t s = dm.s, d = dm.d, group = dm.hq / dm.hkv;
  const int64_t nqb = (s + kBlock - 1) / kBlock;
  const int64_t bh = dm.b * dm.hq;
  const int64_t q_stride = dm.hq * d, kv_stride = dm.hkv * d;
  // K^T [d, ldk] and V [s, d] in fp32 for every (batch, kv head), packed
  // once and shared by the query-block tasks (linear in s).
  const int64_t ldk = PaddedLd(s);
  const int64_t per_kv = ldk * d + s * d;
  Tensor packed = Tensor::Empty({dm.b * dm.hkv * per_kv}, DType::kFloat32);
  float* packed_data = packed.data<float>();
  ThreadPool::Global().ParallelFor(
      dm.b * dm.hkv, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t task = t0; task < t1; ++task) {
          const int64_t bi = task / dm.hkv, kvh = task % dm.hkv;
          float* kt = packed_data + task * per_kv;
          PackTransposed(k + bi * s * kv_stride + kvh * d, kv_stride, s, d, kt,
                         ldk);
          PackRows(v + bi * s * kv_stride + kvh * d, kv_stride, s, d, 1.0f,
                   kt + ldk * d);
        }
      });
  ThreadPool::Global().ParallelFor(nqb * bh, 1, [&](int64_t t0, int64_t t1) {
    // Scratch: Q block, scores, O accumulator, running max and sum.
    Tensor scratch = Tensor::Empty(
        {2 * kBlock * d + kBlock * kBlock + 2 * kBlock}, DType::kFloat32);
    float* qp = scratch.data<float>();
    float* oacc = qp + kBlock * d;
    float* sc = oacc + kBlock * d;
    float* mrow = sc + kBlock * kBlock;
    float* lrow = mrow + kBlock;
    std::vector<uint32_t> word_buffer(dm.dropout_p > 0 ? kBlock : 0);
    uint32_t* words = word_buffer.data();
    for (int64_t task = t0; task < t1; ++task) {
      // Longest (last) query blocks first for balance.
      const int64_t qb = nqb - 1 - task / bh;
      const int64_t bi = (task % bh) / dm.hq, h = task % dm.hq;
      const int64_t kvh = h / group;
      const int64_t i0 = qb * kBlock, br = std::min(kBlock, s - i0);
      const int64_t kend = dm.causal ? i0 + br : s;
      // Packed documents and windows: start at the block holding the
      // smallest first key of these rows.
      const int64_t kbegin = FirstKeyOfBlock(dm, bi, i0, br) / kBlock * kBlock;
      const float* kt = packed_data + (bi * dm.hkv + kvh) * per_kv;
      const float* vp = kt + ldk * d;
      const TQ* qh = q + (bi * s + i0) * q_stride + h * d;
      PackRows(qh, q_stride, br, d, dm.scale, qp);
      std::fill(oacc, oacc + br * d, 0.0f);
      std::fill(mrow, mrow + br, -std::numeric_limits<float>::infinity());
      std::fill(lrow, lrow + br, 0.0f);
      for (int64_t j0 = kbegin; j0 < kend; j0 += kBlock) {
        const int64_t bc = std::min(kBlock, kend - j0);
        BlockGemm(br, bc, d, qp, d, 1, kt + j0, ldk, sc, kBlock, false);
        OnlineSoftmaxBlock8(dm, bi, h, i0, br, j0, bc,
                            /*scale_scores=*/false, sc, mrow, lrow, oacc, words,
                            nullptr);
        BlockGemm(br, d, bc, sc, kBlock, 1, vp + j0 * d, d, oacc, d, true);
      }
      for (int64_t r = 0; r < br; ++r) {
        TO* orow = out + (bi * s + i0 + r) * q_stride + h * d;
        // A row that saw no key (possible only with first_key): out 0 and
        // lse -inf, which the softmax merge of a CP ring ignores.
        const bool none = lrow[r] == 0.0f;
        nn::FromF32(oacc + r * d, orow, d, none ? 0.0f : 1.0f / lrow[r]);
        lse[(bi * dm.hq + h) * s + i0 + r] =
            none ? -std::numeric_limits<float>::infinity()
                 : mrow[r] + std::log(lrow[r]);
      }
    }
  });
}

template <typename TQ, typename TO, typename TG, typename TD>
void BackwardCpu(const Dims& dm, const TQ* q, const TQ* k, const TQ* v,
                 const TO* out, const TO* dout, const float* lse, TG* dq,
                 TD* dk, TD* dv) {
  const int64_t s = dm.s, d = dm.d, group = dm.hq / dm.hkv;
  const int64_t q_stride = dm.hq * d, kv_stride = dm.hkv * d;
  ThreadPool::Global().ParallelFor(
      dm.b * dm.hkv, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t task = t0; task < t1; ++task) {
          const int64_t bi = task / dm.hkv, kvh = task % dm.hkv;
          // Scratch: K, K^T, V^T, dK, dV, Q (scaled), dO, dQ (each [s, d]), the
          // row terms D, and two score blocks.
          const int64_t ldt = PaddedLd(s);
          Tensor scratch =
              Tensor::Empty({6 * s * d + 2 * ldt * d + s + 2 * kBlock * kBlock},
                            DType::kFloat32);
          float* kp = scratch.data<float>();
          float* kt = kp + s * d;
          float* vt = kt + ldt * d;
          float* dkp = vt + ldt * d;
          float* dvp = dkp + s * d;
          float* qp = dvp + s * d;
          float* dop = qp + s * d;
          float* dqp = dop + s * d;
          float* drow = dqp + s * d;
          float* pb = drow + s;
          float* dsb = pb + kBlock * kBlock;
          std::vector<uint32_t> words(dm.dropout_p > 0 ? kBlock : 0);
          std::vector<float> mask(dm.dropout_p > 0 ? kBlock : 0);
          const TQ* kh = k + bi * s * kv_stride + kvh * d;
          const TQ* vh = v + bi * s * kv_stride + kvh * d;
          PackRows(kh, kv_stride, s, d, 1.0f, kp);
          PackTransposed(kh, kv_stride, s, d, kt, ldt);
          PackTransposed(vh, kv_stride, s, d, vt, ldt);
          std::fill(dkp, dkp + 2 * s * d, 0.0f);
          for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
            const int64_t off = bi * s * q_stride + h * d;
            PackRows(q + off, q_stride, s, d, dm.scale, qp);
            PackRows(dout + off, q_stride, s, d, 1.0f, dop);
            for (int64_t t = 0; t < s; ++t) {
              const TO* orow = out + off + t * q_stride;
              const float* g = dop + t * d;
              __m256 acc = _mm256_setzero_ps();
              int64_t x = 0;
              for (; x + 8 <= d; x += 8) {
                acc = _mm256_fmadd_ps(Load8(orow + x), _mm256_loadu_ps(g + x),
                                      acc);
              }
              float sum = nn::HSum(acc);
              for (; x < d; ++x) sum += LoadS(orow + x) * g[x];
              drow[t] = sum;
            }
            std::fill(dqp, dqp + s * d, 0.0f);
            const float* lh = lse + (bi * dm.hq + h) * s;
            for (int64_t j0 = 0; j0 < s; j0 += kBlock) {
              const int64_t bc = std::min(kBlock, s - j0);
              for (int64_t i0 = dm.causal ? j0 : 0; i0 < s; i0 += kBlock) {
                const int64_t br = std::min(kBlock, s - i0);
                // Every row of the query block starts after this key block
                // (another document, or out of the window): nothing to do.
                if (FirstKeyOfBlock(dm, bi, i0, br) >= j0 + bc) continue;
                // P = exp(S - lse), S = (scale q) k^T.
                BlockGemm(br, bc, d, qp + i0 * d, d, 1, kt + j0, ldt, pb,
                          kBlock, false);
                for (int64_t r = 0; r < br; ++r) {
                  const KeyRange vis = Visible(dm, bi, i0 + r, j0, bc);
                  if (vis.empty()) {
                    std::fill(pb + r * kBlock, pb + r * kBlock + bc, 0.0f);
                  } else {
                    ExpRange(pb + r * kBlock, vis.begin, vis.end, bc,
                             lh[i0 + r]);
                  }
                }
                if (dm.dropout_p > 0) {
                  // With dropout (mask M, keep scale c): O = (P*M*c) V, so
                  // dV uses P*M*c and dP = (dO V^T)*M*c; D = rowsum(dO*O)
                  // still equals rowsum(P * dP).
                  BlockGemm(br, bc, d, dop + i0 * d, d, 1, vt + j0, ldt, dsb,
                            kBlock, false);
                  DropoutBlockGrads(dm, bi, h, i0, j0, br, bc, drow, pb, dsb,
                                    mask.data(), words.data());
                  BlockGemm(bc, d, br, pb, 1, kBlock, dop + i0 * d, d,
                            dvp + j0 * d, d, true);
                  BlockGemm(br, d, bc, dsb, kBlock, 1, kp + j0 * d, d,
                            dqp + i0 * d, d, true);
                  BlockGemm(bc, d, br, dsb, 1, kBlock, qp + i0 * d, d,
                            dkp + j0 * d, d, true);
                  continue;
                }
                // dV_j += P^T dO_i.
                BlockGemm(bc, d, br, pb, 1, kBlock, dop + i0 * d, d,
                          dvp + j0 * d, d, true);
                // dP = dO_i V_j^T; dS = P * (dP - D).
                BlockGemm(br, bc, d, dop + i0 * d, d, 1, vt + j0, ldt, dsb,
                          kBlock, false);
                for (int64_t r = 0; r < br; ++r) {
                  float* ds = dsb + r * kBlock;
                  const float* p = pb + r * kBlock;
                  const __m256 dr = _mm256_set1_ps(drow[i0 + r]);
                  for (int64_t c = 0; c < bc; c += 8) {
                    _mm256_storeu_ps(
                        ds + c,
                        _mm256_mul_ps(
                            _mm256_loadu_ps(p + c),
                            _mm256_sub_ps(_mm256_loadu_ps(ds + c), dr)));
                  }
                }
                // dQ_i += dS K_j (times scale at the end); dK_j += dS^T (scale
                // q).
                BlockGemm(br, d, bc, dsb, kBlock, 1, kp + j0 * d, d,
                          dqp + i0 * d, d, true);
                BlockGemm(bc, d, br, dsb, 1, kBlock, qp + i0 * d, d,
                          dkp + j0 * d, d, true);
              }
            }
            for (int64_t t = 0; t < s; ++t) {
              nn::FromF32(dqp + t * d, dq + off + t * q_stride, d, dm.scale);
            }
          }
          for (int64_t t = 0; t < s; ++t) {
            const int64_t o = (bi * s + t) * kv_stride + kvh * d;
            nn::FromF32(dkp + t * d, dk + o, d);
            nn::FromF32(dvp + t * d, dv + o, d);
          }
        }
      });
}

// ---- Choice of the bf16 path (CpuBf16AttentionPath).

CpuBf16AttentionPath DetectBf16Path() {
  const char* env = std::getenv("MCC_BF16_ATTENTION");
  if (env != nullptr && *env != '\0') {
    const std::string v(env);
    if (v == "widened") return CpuBf16AttentionPath::kWidened;
    if (v == "dot" && !CpuSupportsAvx512Bf16()) {
      LOG(FATAL) << "MCC_BF16_ATTENTION=dot, but this CPU (or its operating "
                    "system) does not support AVX512-BF16";
    }
    if (v != "dot" && v != "auto") {
      LOG(FATAL) << "MCC_BF16_ATTENTION must be auto, dot or widened, got '"
                 << v << "'";
    }
  }
  return CpuSupportsAvx512Bf16() ? CpuBf16AttentionPath::kDotProduct
                                 : CpuBf16AttentionPath::kWidened;
}

std::atomic<int> g_bf16_path{-1};

// bf16 inputs of this problem take the dot-product kernels: the path is
// chosen, the kernels run AVX-512, and pairs of head_dim fill whole words.
bool UseBf16Dot(const Dims& dm) {
  return CpuBf16AttentionPathInUse() == CpuBf16AttentionPath::kDotProduct &&
         KernelIsa() == CpuIsa::kAvx512 && dm.d % 2 == 0;
}

// ---- bf16 inputs through AVX512-BF16 (CpuBf16AttentionPath::kDotProduct).

inline int64_t RoundUpEven(int64_t n) { return (n + 1) / 2 * 2; }

// The softmax pieces of the dot-product path in 512-bit vectors (that path
// runs only where AVX-512 is on).
#define MCC_AVX512_SOFTMAX \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))

// Transposes 16 x 16 32-bit lanes in registers: r[i] lane j -> r[j] lane i.
MCC_AVX512_SOFTMAX inline void Transpose16x16(__m512i* r) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + j], 128-bit lane L: rows 4i..4i+3 of column 4L + j.
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);
    const __m512i v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x88);
    const __m512i w1 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xDD);
    r[j] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[j + 4] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[j + 8] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    r[j + 12] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

// dst[j * ldd + i] = src[i * lds + j] for 32-bit elements, i < rows,
// j < cols, in 16 x 16 tiles through registers.
MCC_AVX512_SOFTMAX void Transpose32(const uint32_t* src, int64_t lds,
                                    int64_t rows, int64_t cols, uint32_t* dst,
                                    int64_t ldd) {
  for (int64_t i0 = 0; i0 < rows; i0 += 16) {
    const int64_t ni = std::min<int64_t>(16, rows - i0);
    for (int64_t j0 = 0; j0 < cols; j0 += 16) {
      const int64_t nj = std::min<int64_t>(16, cols - j0);
      const __mmask16 mj = Lanes(nj);
      __m512i r[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        r[i] = i < ni ? _mm512_maskz_loadu_epi32(mj, src + (i0 + i) * lds + j0)
                      : _mm512_setzero_si512();
      }
      Transpose16x16(r);
      const __mmask16 mi = Lanes(ni);
      for (int64_t j = 0; j < nj; ++j) {
        _mm512_mask_storeu_epi32(dst + (j0 + j) * ldd + i0, mi, r[j]);
      }
    }
  }
}

// K^T of one kv head in pair layout for Bf16DotGemm's B: columns are keys,
// word (x / 2) * ld_words + t holds k[t, x] and k[t, x + 1] (d and the row
// stride even): the transpose of the rows read as pair words.
void PackPairsTransposed(const BFloat16* src, int64_t stride, int64_t rows,
                         int64_t d, BFloat16* dst, int64_t ld_words) {
  Transpose32(reinterpret_cast<const uint32_t*>(src), stride / 2, rows, d / 2,
              reinterpret_cast<uint32_t*>(dst), ld_words);
}

// Exp16 (avx512_util.h): Exp8's operations lane for lane, so each lane
// equals Exp8's bit for bit.

#define MCC_AVX512_BF16_SOFTMAX \
  __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq,avx512bf16")))

#define MCC_ONLINE_SOFTMAX_NAME OnlineSoftmaxBlock16
#define MCC_ONLINE_SOFTMAX_LANES SoftmaxLanes16
#define MCC_ONLINE_SOFTMAX_TARGET MCC_AVX512_BF16_SOFTMAX
#include "core/ops/online_softmax_block.inc"

// The forward's online softmax of the dot-product path: OnlineSoftmaxBlock
// in 16 lanes (scores scaled here), P rounded to bf16 into pb.
MCC_AVX512_BF16_SOFTMAX void ForwardSoftmax16(const Dims& dm, int64_t bi,
                                              int64_t h, int64_t i0, int64_t br,
                                              int64_t j0, int64_t bc, float* sc,
                                              float* mrow, float* lrow,
                                              float* oacc, uint32_t* words,
                                              BFloat16* pb) {
  OnlineSoftmaxBlock16(dm, bi, h, i0, br, j0, bc,
                       /*scale_scores=*/true, sc, mrow, lrow, oacc, words, pb);
}

// Pair words of two rows converted together (v = _mm512_cvtne2ps_pbh(row
// 1, row 0): row 0's 16 values low, row 1's high): word c = row0[c] |
// row1[c] << 16, RoundToBf16Pairs's layout.
MCC_AVX512_BF16_SOFTMAX inline __m512i PairWords(__m512bh v) {
  alignas(64) static const uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), (__m512i)v);
}

// P (br x bc fp32, row stride kBlock) rounded to bf16 in pair layout for
// Bf16DotGemm's B: RoundToBf16Pairs(pb, kBlock, br, bc, pairs, 2 kBlock).
MCC_AVX512_BF16_SOFTMAX void PairsOfBlock16(const float* pb, int64_t br,
                                            int64_t bc, BFloat16* pairs) {
  for (int64_t r = 0; r < br; r += 2) {
    const float* p0 = pb + r * kBlock;
    const bool second = r + 1 < br;
    uint32_t* out = reinterpret_cast<uint32_t*>(pairs + r * kBlock);
    for (int64_t c = 0; c < bc; c += 16) {
      const __mmask16 m = Lanes(bc - c);
      const __m512 lo = _mm512_maskz_loadu_ps(m, p0 + c);
      const __m512 hi = second ? _mm512_maskz_loadu_ps(m, p0 + kBlock + c)
                               : _mm512_setzero_ps();
      _mm512_mask_storeu_epi32(out + c, m,
                               PairWords(_mm512_cvtne2ps_pbh(hi, lo)));
    }
  }
}

// dS = P (dP - D) of a block without dropout (dsb holds dP), straight to
// bf16 in the two layouts its products take: rows (ds_rows, row stride
// kBlock, a zero column after an odd bc: RoundToBf16Rows) and pairs
// (ds_pairs: RoundToBf16Pairs); the fp32 dS is not stored.
MCC_AVX512_BF16_SOFTMAX void DsToBf16Block16(const float* pb, const float* dsb,
                                             int64_t br, int64_t bc,
                                             const float* drow,
                                             BFloat16* ds_rows,
                                             BFloat16* ds_pairs) {
  for (int64_t r = 0; r < br; r += 2) {
    const bool second = r + 1 < br;
    const float* p0 = pb + r * kBlock;
    const float* dp0 = dsb + r * kBlock;
    const __m512 d0 = _mm512_set1_ps(drow[r]);
    const __m512 d1 = _mm512_set1_ps(second ? drow[r + 1] : 0.0f);
    BFloat16* row0 = ds_rows + r * kBlock;
    uint32_t* out = reinterpret_cast<uint32_t*>(ds_pairs + r * kBlock);
    for (int64_t c = 0; c < bc; c += 16) {
      const __mmask16 m = Lanes(bc - c);
      const __m512 lo =
          _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p0 + c),
                        _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dp0 + c), d0));
      const __m512 hi =
          second ? _mm512_mul_ps(
                       _mm512_maskz_loadu_ps(m, p0 + kBlock + c),
                       _mm512_sub_ps(_mm512_maskz_loadu_ps(m, dp0 + kBlock + c),
                                     d1))
                 : _mm512_setzero_ps();
      const __m512bh v = _mm512_cvtne2ps_pbh(hi, lo);
      const __m512i bits = (__m512i)v;
      _mm256_mask_storeu_epi16(row0 + c, m, _mm512_castsi512_si256(bits));
      if (second) {
        _mm256_mask_storeu_epi16(row0 + kBlock + c, m,
                                 _mm512_extracti64x4_epi64(bits, 1));
      }
      _mm512_mask_storeu_epi32(out + c, m, PairWords(v));
    }
    if (bc % 2 != 0) {
      row0[bc] = BFloat16{};
      if (second) row0[kBlock + bc] = BFloat16{};
    }
  }
}

#undef MCC_AVX512_BF16_SOFTMAX

// The backward's P = exp(scale S - lse) over one block in place (0 outside
// each row's visible keys), one pass a row: the same operations as the
// forward's ForwardSoftmax16.
MCC_AVX512_SOFTMAX void BackwardProbabilities16(const Dims& dm, int64_t bi,
                                                int64_t i0, int64_t br,
                                                int64_t j0, int64_t bc,
                                                const float* lse, float* pb) {
  const __m512 scale = _mm512_set1_ps(dm.scale);
  for (int64_t r = 0; r < br; ++r) {
    float* p = pb + r * kBlock;
    const KeyRange vis = Visible(dm, bi, i0 + r, j0, bc);
    if (vis.empty()) {
      std::fill(p, p + bc, 0.0f);
      continue;
    }
    std::fill(p, p + vis.begin, 0.0f);
    const __m512 sub = _mm512_set1_ps(lse[i0 + r]);
    for (int64_t c = vis.begin; c < vis.end; c += 16) {
      const __mmask16 m = Lanes(vis.end - c);
      const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, p + c), scale);
      _mm512_mask_storeu_ps(p + c, m, Exp16(_mm512_sub_ps(x, sub)));
    }
    std::fill(p + vis.end, p + bc, 0.0f);
  }
}

#undef MCC_AVX512_SOFTMAX

// rows [rows, d] at row stride `stride` -> dst [rows, d] (contiguous).
inline void CopyRows(const BFloat16* src, int64_t stride, int64_t rows,
                     int64_t d, BFloat16* dst) {
  for (int64_t t = 0; t < rows; ++t) {
    std::memcpy(dst + t * d, src + t * stride, d * sizeof(BFloat16));
  }
}

// ForwardCpu's algorithm with bf16 q, k, v (d even): S = q k^T on the
// dot-product instruction, scaled in fp32; P rounded to bf16 for P V.
template <typename TO>
void ForwardBf16Dot(const Dims& dm, const BFloat16* q, const BFloat16* k,
                    const BFloat16* v, TO* out, float* lse) {
  const int64_t s = dm.s, d = dm.d, group = dm.hq / dm.hkv;
  const int64_t nqb = (s + kBlock - 1) / kBlock;
  const int64_t bh = dm.b * dm.hq;
  const int64_t q_stride = dm.hq * d, kv_stride = dm.hkv * d;
  // K^T [d / 2, ldk words] and V [ceil(s / 2), 2d] in pair layout for every
  // (batch, kv head), packed once and shared by the query-block tasks.
  const int64_t ldk = PaddedLd(s);
  const int64_t vt_offset = d * ldk;
  const int64_t per_kv = vt_offset + RoundUpEven(s) * d;
  Tensor packed = Tensor::Empty({dm.b * dm.hkv * per_kv}, DType::kBFloat16);
  BFloat16* packed_data = packed.data<BFloat16>();
  ThreadPool::Global().ParallelFor(
      dm.b * dm.hkv, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t task = t0; task < t1; ++task) {
          const int64_t bi = task / dm.hkv, kvh = task % dm.hkv;
          BFloat16* kt = packed_data + task * per_kv;
          PackPairsTransposed(k + bi * s * kv_stride + kvh * d, kv_stride, s, d,
                              kt, ldk);
          PackBf16RowPairs(v + bi * s * kv_stride + kvh * d, kv_stride, s, d,
                           kt + vt_offset);
        }
      });
  ThreadPool::Global().ParallelFor(nqb * bh, 1, [&](int64_t t0, int64_t t1) {
    // Scratch: O accumulator, scores, running max and sum; P and the query
    // block in bf16.
    Tensor scratch = Tensor::Empty({kBlock * d + kBlock * kBlock + 2 * kBlock},
                                   DType::kFloat32);
    Tensor p_scratch =
        Tensor::Empty({kBlock * kBlock + kBlock * d}, DType::kBFloat16);
    float* oacc = scratch.data<float>();
    float* sc = oacc + kBlock * d;
    float* mrow = sc + kBlock * kBlock;
    float* lrow = mrow + kBlock;
    BFloat16* pb = p_scratch.data<BFloat16>();
    BFloat16* qblock = pb + kBlock * kBlock;
    std::vector<uint32_t> word_buffer(dm.dropout_p > 0 ? kBlock : 0);
    uint32_t* words = word_buffer.data();
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t qb = nqb - 1 - task / bh;
      const int64_t bi = (task % bh) / dm.hq, h = task % dm.hq;
      const int64_t kvh = h / group;
      const int64_t i0 = qb * kBlock, br = std::min(kBlock, s - i0);
      const int64_t kend = dm.causal ? i0 + br : s;
      const int64_t kbegin = FirstKeyOfBlock(dm, bi, i0, br) / kBlock * kBlock;
      const BFloat16* kt = packed_data + (bi * dm.hkv + kvh) * per_kv;
      const BFloat16* vp = kt + vt_offset;
      // The query rows side by side: read from the [b, s, h, d] tensor at
      // their row stride (a power of two), the block's rows share a few L1
      // sets and evict each other in every product.
      CopyRows(q + (bi * s + i0) * q_stride + h * d, q_stride, br, d, qblock);
      std::fill(oacc, oacc + br * d, 0.0f);
      std::fill(mrow, mrow + br, -std::numeric_limits<float>::infinity());
      std::fill(lrow, lrow + br, 0.0f);
      for (int64_t j0 = kbegin; j0 < kend; j0 += kBlock) {
        const int64_t bc = std::min(kBlock, kend - j0);
        Bf16DotGemm(br, bc, d, qblock, d / 2, 1, kt + 2 * j0, 2 * ldk, sc,
                    kBlock, false);
        ForwardSoftmax16(dm, bi, h, i0, br, j0, bc, sc, mrow, lrow, oacc, words,
                         pb);
        Bf16DotGemm(br, d, RoundUpEven(bc), pb, kBlock / 2, 1, vp + j0 * d,
                    2 * d, oacc, d, true);
      }
      for (int64_t r = 0; r < br; ++r) {
        TO* orow = out + (bi * s + i0 + r) * q_stride + h * d;
        const bool none = lrow[r] == 0.0f;
        nn::FromF32(oacc + r * d, orow, d, none ? 0.0f : 1.0f / lrow[r]);
        lse[(bi * dm.hq + h) * s + i0 + r] =
            none ? -std::numeric_limits<float>::infinity()
                 : mrow[r] + std::log(lrow[r]);
      }
    }
  });
}

// BackwardCpu's algorithm with bf16 q, k, v, out and dout (d even). dK and
// dV are accumulated transposed ([d, s]) so that every product reads its
// operands in the layouts Bf16DotGemm takes without a transpose per block:
//   S = q K^T,  dP = dO V^T      (A: q, dO rows;  B: K^T, V^T pairs)
//   dV^T += dO^T P,  dK^T += q^T dS  (A: dO, q row pairs; B: P, dS pairs)
//   dQ += dS K                   (A: dS rows;      B: K row pairs)
template <typename TG, typename TD>
void BackwardBf16Dot(const Dims& dm, const BFloat16* q, const BFloat16* k,
                     const BFloat16* v, const BFloat16* out,
                     const BFloat16* dout, const float* lse, TG* dq, TD* dk,
                     TD* dv) {
  const int64_t s = dm.s, d = dm.d, group = dm.hq / dm.hkv;
  const int64_t q_stride = dm.hq * d, kv_stride = dm.hkv * d;
  const int64_t s2 = RoundUpEven(s);
  ThreadPool::Global().ParallelFor(
      dm.b * dm.hkv, 1, [&](int64_t t0, int64_t t1) {
        // Scratch once per run of tasks (fresh pages cost as much as the
        // softmax at these speeds).
        {
          const int64_t ldt = PaddedLd(s);
          // fp32: dK^T, dV^T [d, ldt], dQ [s, d], D, P and dP/dS blocks.
          Tensor scratch = Tensor::Empty(
              {2 * d * ldt + s * d + s + 2 * kBlock * kBlock}, DType::kFloat32);
          float* dkt = scratch.data<float>();
          float* dvt = dkt + d * ldt;
          float* dqp = dvt + d * ldt;
          float* drow = dqp + s * d;
          float* pb = drow + s;
          float* dsb = pb + kBlock * kBlock;
          // bf16: K^T, V^T pairs [d / 2, 2 ldt]; K, q, dO row pairs
          // [s2 / 2, 2d]; P pairs, dS pairs and dS rows of one block; q and
          // dO rows side by side [s, d] (at the tensors' row stride, a power
          // of two, a block's rows share a few L1 sets).
          Tensor scratch16 = Tensor::Empty(
              {2 * d * ldt + 3 * s2 * d + 3 * kBlock * kBlock + 2 * s * d},
              DType::kBFloat16);
          BFloat16* kt = scratch16.data<BFloat16>();
          BFloat16* vt = kt + d * ldt;
          BFloat16* kv = vt + d * ldt;
          BFloat16* qv = kv + s2 * d;
          BFloat16* dov = qv + s2 * d;
          BFloat16* p_pairs = dov + s2 * d;
          BFloat16* ds_pairs = p_pairs + kBlock * kBlock;
          BFloat16* ds_rows = ds_pairs + kBlock * kBlock;
          BFloat16* q_rows = ds_rows + kBlock * kBlock;
          BFloat16* do_rows = q_rows + s * d;
          std::vector<uint32_t> words(dm.dropout_p > 0 ? kBlock : 0);
          std::vector<float> mask(dm.dropout_p > 0 ? kBlock : 0);
          for (int64_t task = t0; task < t1; ++task) {
            const int64_t bi = task / dm.hkv, kvh = task % dm.hkv;
            const BFloat16* kh = k + bi * s * kv_stride + kvh * d;
            const BFloat16* vh = v + bi * s * kv_stride + kvh * d;
            PackPairsTransposed(kh, kv_stride, s, d, kt, ldt);
            PackPairsTransposed(vh, kv_stride, s, d, vt, ldt);
            PackBf16RowPairs(kh, kv_stride, s, d, kv);
            std::fill(dkt, dkt + 2 * d * ldt, 0.0f);
            for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
              const int64_t off = bi * s * q_stride + h * d;
              CopyRows(q + off, q_stride, s, d, q_rows);
              CopyRows(dout + off, q_stride, s, d, do_rows);
              PackBf16RowPairs(q_rows, d, s, d, qv);
              PackBf16RowPairs(do_rows, d, s, d, dov);
              for (int64_t t = 0; t < s; ++t) {
                const BFloat16* orow = out + off + t * q_stride;
                const BFloat16* grow = do_rows + t * d;
                __m256 acc = _mm256_setzero_ps();
                int64_t x = 0;
                for (; x + 8 <= d; x += 8) {
                  acc = _mm256_fmadd_ps(Load8(orow + x), Load8(grow + x), acc);
                }
                float sum = nn::HSum(acc);
                for (; x < d; ++x) sum += LoadS(orow + x) * LoadS(grow + x);
                drow[t] = sum;
              }
              std::fill(dqp, dqp + s * d, 0.0f);
              const float* lh = lse + (bi * dm.hq + h) * s;
              for (int64_t j0 = 0; j0 < s; j0 += kBlock) {
                const int64_t bc = std::min(kBlock, s - j0);
                for (int64_t i0 = dm.causal ? j0 : 0; i0 < s; i0 += kBlock) {
                  const int64_t br = std::min(kBlock, s - i0);
                  if (FirstKeyOfBlock(dm, bi, i0, br) >= j0 + bc) continue;
                  // P = exp(scale S - lse).
                  Bf16DotGemm(br, bc, d, q_rows + i0 * d, d / 2, 1, kt + 2 * j0,
                              2 * ldt, pb, kBlock, false);
                  BackwardProbabilities16(dm, bi, i0, br, j0, bc, lh, pb);
                  // dP = dO_i V_j^T; dS = P * (dP - D) (dropout as in
                  // BackwardCpu: dV takes P*M*c, dP is masked likewise).
                  Bf16DotGemm(br, bc, d, do_rows + i0 * d, d / 2, 1,
                              vt + 2 * j0, 2 * ldt, dsb, kBlock, false);
                  if (dm.dropout_p == 0) {
                    PairsOfBlock16(pb, br, bc, p_pairs);
                    DsToBf16Block16(pb, dsb, br, bc, drow + i0, ds_rows,
                                    ds_pairs);
                  } else {
                    DropoutBlockGrads(dm, bi, h, i0, j0, br, bc, drow, pb, dsb,
                                      mask.data(), words.data());
                    RoundToBf16Pairs(pb, kBlock, br, bc, p_pairs, 2 * kBlock);
                    RoundToBf16Pairs(dsb, kBlock, br, bc, ds_pairs, 2 * kBlock);
                    RoundToBf16Rows(dsb, kBlock, br, bc, ds_rows, kBlock);
                  }
                  const int64_t kq = RoundUpEven(br), kk = RoundUpEven(bc);
                  // dV_j^T += dO_i^T P; dK_j^T += q_i^T dS (scale at the end).
                  Bf16DotGemm(d, bc, kq, dov + i0 * d, 1, d, p_pairs,
                              2 * kBlock, dvt + j0, ldt, true);
                  Bf16DotGemm(d, bc, kq, qv + i0 * d, 1, d, ds_pairs,
                              2 * kBlock, dkt + j0, ldt, true);
                  // dQ_i += dS K_j (scale at the end).
                  Bf16DotGemm(br, d, kk, ds_rows, kBlock / 2, 1, kv + j0 * d,
                              2 * d, dqp + i0 * d, d, true);
                }
              }
              for (int64_t t = 0; t < s; ++t) {
                nn::FromF32(dqp + t * d, dq + off + t * q_stride, d, dm.scale);
              }
            }
            // dK, dV rows out of the transposed panels, through dQ's
            // scratch (free now).
            auto* rows = reinterpret_cast<uint32_t*>(dqp);
            Transpose32(reinterpret_cast<const uint32_t*>(dkt), ldt, d, s, rows,
                        d);
            for (int64_t t = 0; t < s; ++t) {
              nn::FromF32(dqp + t * d, dk + (bi * s + t) * kv_stride + kvh * d,
                          d, dm.scale);
            }
            Transpose32(reinterpret_cast<const uint32_t*>(dvt), ldt, d, s, rows,
                        d);
            for (int64_t t = 0; t < s; ++t) {
              nn::FromF32(dqp + t * d, dv + (bi * s + t) * kv_stride + kvh * d,
                          d);
            }
          }
        }
      });
}

Dims DimsOf(const Tensor& q, const Tensor& k, const AttentionOptions& options);

absl::Status CheckQkv(absl::string_view op, const Tensor& q, const Tensor& k,
                      const Tensor& v, const AttentionOptions& options,
                      Dims* dm) {
  MCC_RETURN_IF_ERROR(nn::Defined(op, "q", &q));
  MCC_RETURN_IF_ERROR(nn::Defined(op, "k", &k));
  MCC_RETURN_IF_ERROR(nn::Defined(op, "v", &v));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, "q", q));
  if (q.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": q must be [batch, seq, heads, head_dim], got ", q.Describe()));
  }
  if (k.dim() != 4 || k.size(0) != q.size(0) || k.size(1) != q.size(1) ||
      k.size(3) != q.size(3) || k.size(2) == 0 || q.size(2) % k.size(2) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": k ", k.Describe(), " must be [batch, seq, kv_heads, head_dim] ",
        "with kv_heads dividing the heads of q ", q.Describe()));
  }
  MCC_RETURN_IF_ERROR(nn::SameShape(op, "k", k, "v", v));
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": q ", q.Describe(), ", k ", k.Describe(), " and v ",
                     v.Describe(), " must have the same dtype"));
  }
  MCC_RETURN_IF_ERROR(nn::SameDevice(op, "q", q, "k", k));
  MCC_RETURN_IF_ERROR(nn::SameDevice(op, "q", q, "v", v));
  if (!(options.softmax_scale >= 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": softmax_scale must be >= 0 (0: 1/sqrt(head_dim)), got ",
        options.softmax_scale));
  }
  if (!(options.dropout_p >= 0.0f && options.dropout_p < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": dropout_p must be in [0, 1), got ", options.dropout_p));
  }
  const Tensor& first_key = options.first_key;
  if (first_key.defined() &&
      (first_key.dtype() != DType::kInt32 ||
       !(first_key.device().is_cpu() || first_key.device() == q.device()) ||
       first_key.shape() != Shape{q.size(0), q.size(1)})) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": first_key ", first_key.Describe(),
        " (packed documents / sliding window) must be int32 [batch, seq] = ",
        ShapeToString({q.size(0), q.size(1)}), " on the host or on q's device ",
        q.device().ToString()));
  }
  // The checks need the sizes only: first_key's data is the kernels' to read
  // (it may be on q's device).
  AttentionOptions sizes = options;
  sizes.first_key = Tensor();
  *dm = DimsOf(q, k, sizes);
  if (dm->head_offset < 0 || dm->head_offset + dm->hq > dm->total_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": heads [", dm->head_offset, ", ", dm->head_offset + dm->hq,
        ") are not within total_heads ", dm->total_heads));
  }
  return absl::OkStatus();
}

// The problem's sizes and options, for q and k already checked.
Dims DimsOf(const Tensor& q, const Tensor& k, const AttentionOptions& options) {
  Dims d;
  Dims* dm = &d;
  dm->b = q.size(0);
  dm->s = q.size(1);
  dm->hq = q.size(2);
  dm->hkv = k.size(2);
  dm->d = q.size(3);
  dm->causal = options.causal;
  dm->scale =
      options.softmax_scale > 0.0f
          ? options.softmax_scale
          : 1.0f / std::sqrt(static_cast<float>(std::max<int64_t>(dm->d, 1)));
  dm->dropout_p = options.dropout_p;
  dm->seed = options.dropout_seed;
  dm->offset = options.dropout_offset;
  dm->total_heads = options.total_heads > 0 ? options.total_heads : dm->hq;
  dm->head_offset = options.head_offset;
  if (options.first_key.defined()) {
    dm->first_key = options.first_key.data<int32_t>();
  }
  return d;
}

absl::Status CheckOut(absl::string_view op, const char* ref_name,
                      const Tensor& ref, const char* name, const Tensor* t) {
  MCC_RETURN_IF_ERROR(nn::Defined(op, name, t));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, name, *t));
  MCC_RETURN_IF_ERROR(nn::SameShape(op, ref_name, ref, name, *t));
  return nn::SameDevice(op, ref_name, ref, name, *t);
}

absl::Status CheckLse(absl::string_view op, const Tensor& q, const Dims& dm,
                      const Tensor* lse) {
  MCC_RETURN_IF_ERROR(nn::Defined(op, "lse", lse));
  MCC_RETURN_IF_ERROR(nn::IsF32(op, "lse", *lse));
  if (lse->shape() != Shape{dm.b, dm.hq, dm.s}) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": lse ", lse->Describe(), " must be [batch, heads, seq] = ",
        ShapeToString({dm.b, dm.hq, dm.s}), " for q ", q.Describe()));
  }
  return nn::SameDevice(op, "q", q, "lse", *lse);
}

}  // namespace

absl::Status FlashAttentionForward(const Tensor& q, const Tensor& k,
                                   const Tensor& v,
                                   const AttentionOptions& options, Tensor* out,
                                   Tensor* lse) {
  ScopedOpTimer op_timer("FlashAttentionForward");
  constexpr absl::string_view op = "FlashAttentionForward";
  Dims dm;
  MCC_RETURN_IF_ERROR(CheckQkv(op, q, k, v, options, &dm));
  MCC_RETURN_IF_ERROR(CheckOut(op, "q", q, "out", out));
  MCC_RETURN_IF_ERROR(CheckLse(op, q, dm, lse));
  return FlashAttentionForwardKernels()(q.device(), q, k, v, options, out, lse);
}

namespace {

absl::Status FlashAttentionForwardCpu(const Tensor& q, const Tensor& k,
                                      const Tensor& v,
                                      const AttentionOptions& options,
                                      Tensor* out, Tensor* lse) {
  if (q.numel() == 0) return absl::OkStatus();
  const Dims dm = DimsOf(q, k, options);
  if (q.dtype() == DType::kBFloat16 && UseBf16Dot(dm)) {
    nn::DispatchFloat(out->dtype(), [&](auto to) {
      using TO = decltype(to);
      ForwardBf16Dot(dm, q.data<BFloat16>(), k.data<BFloat16>(),
                     v.data<BFloat16>(), out->data<TO>(), lse->data<float>());
    });
    return absl::OkStatus();
  }
  nn::DispatchFloat(q.dtype(), [&](auto tq) {
    using TQ = decltype(tq);
    nn::DispatchFloat(out->dtype(), [&](auto to) {
      using TO = decltype(to);
      ForwardCpu(dm, q.data<TQ>(), k.data<TQ>(), v.data<TQ>(), out->data<TO>(),
                 lse->data<float>());
    });
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status FlashAttentionBackward(const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out,
                                    const Tensor& dout, const Tensor& lse,
                                    const AttentionOptions& options, Tensor* dq,
                                    Tensor* dk, Tensor* dv) {
  ScopedOpTimer op_timer("FlashAttentionBackward");
  constexpr absl::string_view op = "FlashAttentionBackward";
  Dims dm;
  MCC_RETURN_IF_ERROR(CheckQkv(op, q, k, v, options, &dm));
  MCC_RETURN_IF_ERROR(CheckOut(op, "q", q, "out", &out));
  MCC_RETURN_IF_ERROR(CheckOut(op, "q", q, "dout", &dout));
  if (dout.dtype() != out.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dout ", dout.Describe(), " and out ",
                     out.Describe(), " must have the same dtype"));
  }
  MCC_RETURN_IF_ERROR(CheckLse(op, q, dm, &lse));
  MCC_RETURN_IF_ERROR(CheckOut(op, "q", q, "dq", dq));
  MCC_RETURN_IF_ERROR(CheckOut(op, "k", k, "dk", dk));
  MCC_RETURN_IF_ERROR(CheckOut(op, "v", v, "dv", dv));
  if (dk->dtype() != dv->dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dk ", dk->Describe(), " and dv ", dv->Describe(),
                     " must have the same dtype"));
  }
  if (q.numel() != 0) {
    MCC_RETURN_IF_ERROR(CheckOne16BitType(
        op, {{"q", &q}, {"out", &out}, {"dq", dq}, {"dk", dk}}));
  }
  return FlashAttentionBackwardKernels()(q.device(), q, k, v, out, dout, lse,
                                         options, dq, dk, dv);
}

namespace {

absl::Status FlashAttentionBackwardCpu(const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out,
                                       const Tensor& dout, const Tensor& lse,
                                       const AttentionOptions& options,
                                       Tensor* dq, Tensor* dk, Tensor* dv) {
  if (q.numel() == 0) return absl::OkStatus();
  const Dims dm = DimsOf(q, k, options);
  if (q.dtype() == DType::kBFloat16 && out.dtype() == DType::kBFloat16 &&
      UseBf16Dot(dm)) {
    DispatchFloatOr<BFloat16>(dq->dtype(), [&](auto tg) {
      using TG = decltype(tg);
      DispatchFloatOr<BFloat16>(dk->dtype(), [&](auto td) {
        using TD = decltype(td);
        BackwardBf16Dot(dm, q.data<BFloat16>(), k.data<BFloat16>(),
                        v.data<BFloat16>(), out.data<BFloat16>(),
                        dout.data<BFloat16>(), lse.data<float>(),
                        dq->data<TG>(), dk->data<TD>(), dv->data<TD>());
      });
    });
    return absl::OkStatus();
  }
  Dispatch16BitType(
      {q.dtype(), out.dtype(), dq->dtype(), dk->dtype()}, [&](auto th) {
        using H = decltype(th);
        DispatchFloatOr<H>(q.dtype(), [&](auto tq) {
          using TQ = decltype(tq);
          DispatchFloatOr<H>(out.dtype(), [&](auto to) {
            using TO = decltype(to);
            DispatchFloatOr<H>(dq->dtype(), [&](auto tg) {
              using TG = decltype(tg);
              DispatchFloatOr<H>(dk->dtype(), [&](auto td) {
                using TD = decltype(td);
                BackwardCpu(dm, q.data<TQ>(), k.data<TQ>(), v.data<TQ>(),
                            out.data<TO>(), dout.data<TO>(), lse.data<float>(),
                            dq->data<TG>(), dk->data<TD>(), dv->data<TD>());
              });
            });
          });
        });
      });
  return absl::OkStatus();
}

}  // namespace

CpuBf16AttentionPath CpuBf16AttentionPathInUse() {
  int path = g_bf16_path.load(std::memory_order_relaxed);
  if (path < 0) {
    int expected = -1;
    g_bf16_path.compare_exchange_strong(expected,
                                        static_cast<int>(DetectBf16Path()));
    path = g_bf16_path.load(std::memory_order_relaxed);
  }
  return static_cast<CpuBf16AttentionPath>(path);
}

const char* CpuBf16AttentionPathName(CpuBf16AttentionPath path) {
  return path == CpuBf16AttentionPath::kDotProduct ? "AVX512-BF16 dot product"
                                                   : "widened to fp32";
}

namespace internal {

CpuBf16AttentionPath SetCpuBf16AttentionPathForTesting(
    CpuBf16AttentionPath path) {
  const CpuBf16AttentionPath previous = CpuBf16AttentionPathInUse();
  if (!CpuSupportsAvx512Bf16()) path = CpuBf16AttentionPath::kWidened;
  g_bf16_path.store(static_cast<int>(path), std::memory_order_relaxed);
  return previous;
}

}  // namespace internal

MCC_KERNEL_SLOT(FlashAttentionForwardKernel, FlashAttentionForwardKernels,
                "FlashAttentionForward", &FlashAttentionForwardCpu);

MCC_KERNEL_SLOT(FlashAttentionBackwardKernel, FlashAttentionBackwardKernels,
                "FlashAttentionBackward", &FlashAttentionBackwardCpu);

double FlashAttentionForwardFlops(int64_t batch, int64_t seq, int64_t heads,
                                  int64_t head_dim, bool causal) {
  const double f =
      4.0 * batch * heads * static_cast<double>(seq) * seq * head_dim;
  return causal ? f / 2 : f;
}

double FlashAttentionBackwardFlops(int64_t batch, int64_t seq, int64_t heads,
                                   int64_t head_dim, bool causal) {
  return 2.5 * FlashAttentionForwardFlops(batch, seq, heads, head_dim, causal);
}

}  // namespace ops
}  // namespace mcc
