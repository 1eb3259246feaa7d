#include "inference/row_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/ops/cpu_isa.h"
#include "core/thread_pool.h"

namespace mcc {
namespace inference {
namespace {

// The fixed reduction of one output: 8 lanes accumulated over k in steps of
// 8 (fused multiply-add), the lanes summed in a fixed tree, then the k % 8
// tail added in order. Every instantiation below does exactly this per
// output, so the row-block size never changes a result.
inline float HorizontalSum(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

constexpr int kColBlock = 4;

// Eight weights as fp32: loaded, or widened exactly from int8.
inline __m256 LoadWeights8(const float* w) { return _mm256_loadu_ps(w); }
inline __m256 LoadWeights8(const int8_t* w) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
}

// The output's scale: none for fp32 weights, the row's for int8 ones
// (applied once, to the finished sum, as core/ops/int8_gemm.h does).
inline float Scaled(float sum, const float* scales, int64_t c) {
  return scales == nullptr ? sum : sum * scales[c];
}

// Rows [0, MR) of x against columns [0, kColBlock) of w (pointers already
// offset; scales too, or null), writing y with row stride ldy.
template <int MR, typename W>
void MicroKernel(const float* x, int64_t k, const W* w, const float* scales,
                 float* y, int64_t ldy) {
  __m256 acc[MR][kColBlock];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < kColBlock; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const int64_t k8 = k / 8 * 8;
  for (int64_t i = 0; i < k8; i += 8) {
    __m256 xv[MR];
    for (int r = 0; r < MR; ++r) xv[r] = _mm256_loadu_ps(x + r * k + i);
    for (int c = 0; c < kColBlock; ++c) {
      const __m256 wv = LoadWeights8(w + c * k + i);
      for (int r = 0; r < MR; ++r) {
        acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < kColBlock; ++c) {
      float s = HorizontalSum(acc[r][c]);
      for (int64_t i = k8; i < k; ++i) {
        s = std::fma(x[r * k + i], static_cast<float>(w[c * k + i]), s);
      }
      y[r * ldy + c] = Scaled(s, scales, c);
    }
  }
}

// One column (an odd count's last), unscaled: the same per-output
// arithmetic.
template <typename W>
inline float OneOutput(const float* x, int64_t k, const W* w) {
  __m256 acc = _mm256_setzero_ps();
  const int64_t k8 = k / 8 * 8;
  for (int64_t i = 0; i < k8; i += 8) {
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), LoadWeights8(w + i), acc);
  }
  float s = HorizontalSum(acc);
  for (int64_t i = k8; i < k; ++i) {
    s = std::fma(x[i], static_cast<float>(w[i]), s);
  }
  return s;
}

constexpr int kRowBlock = 3;

// Columns [0, n) of int8 weights widened to fp32 (exactly) in buf: a block
// that serves several rows then converts each weight once, not once per
// row block, and computes what the int8 kernels compute, bit for bit (the
// same products of the same values in the same order).
inline const float* Widened(const int8_t* w, int64_t n, int64_t k,
                            std::vector<float>* buf) {
  buf->resize(n * k);
  for (int64_t i = 0; i < n * k; ++i) (*buf)[i] = static_cast<float>(w[i]);
  return buf->data();
}

// ---- AVX-512 (where ops::KernelIsa() says so) -------------------------------
// The same structure with 16 lanes: per output, 16 lanes accumulated over k
// in steps of 16, the k % 16 tail through masked loads (zeros past the end)
// as one more step, then one fixed 16-lane reduction. Every output of a
// machine goes through this one sequence, whatever the row count.

#define MCC_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))

MCC_AVX512 inline __m512 LoadWeights16(const float* w, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, w);
}
MCC_AVX512 inline __m512 LoadWeights16(const int8_t* w, __mmask16 m) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, w)));
}

template <int MR, typename W>
MCC_AVX512 void MicroKernel512(const float* x, int64_t k, const W* w,
                               const float* scales, float* y, int64_t ldy) {
  __m512 acc[MR][kColBlock];
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < kColBlock; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = k - i >= 16
                            ? static_cast<__mmask16>(0xFFFF)
                            : static_cast<__mmask16>((1u << (k - i)) - 1);
    __m512 xv[MR];
    for (int r = 0; r < MR; ++r)
      xv[r] = _mm512_maskz_loadu_ps(m, x + r * k + i);
    for (int c = 0; c < kColBlock; ++c) {
      const __m512 wv = LoadWeights16(w + c * k + i, m);
      for (int r = 0; r < MR; ++r) {
        acc[r][c] = _mm512_fmadd_ps(xv[r], wv, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < kColBlock; ++c) {
      y[r * ldy + c] = Scaled(_mm512_reduce_add_ps(acc[r][c]), scales, c);
    }
  }
}

template <typename W>
MCC_AVX512 float OneOutput512(const float* x, int64_t k, const W* w) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < k; i += 16) {
    const __mmask16 m = k - i >= 16
                            ? static_cast<__mmask16>(0xFFFF)
                            : static_cast<__mmask16>((1u << (k - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + i),
                          LoadWeights16(w + i, m), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// The two ISAs' kernels, for the one column loop below (calls into the
// AVX-512 functions are not inlined into it; a call per micro-kernel is
// noise beside its k x 12 multiply-adds).
struct Avx2Kernels {
  template <int MR, typename W>
  static void Micro(const float* x, int64_t k, const W* w, const float* sc,
                    float* y, int64_t ldy) {
    MicroKernel<MR>(x, k, w, sc, y, ldy);
  }
  template <typename W>
  static float One(const float* x, int64_t k, const W* w) {
    return OneOutput(x, k, w);
  }
};
struct Avx512Kernels {
  template <int MR, typename W>
  static void Micro(const float* x, int64_t k, const W* w, const float* sc,
                    float* y, int64_t ldy) {
    MicroKernel512<MR>(x, k, w, sc, y, ldy);
  }
  template <typename W>
  static float One(const float* x, int64_t k, const W* w) {
    return OneOutput512(x, k, w);
  }
};

// Every row against one block of kColBlock columns (w, scales and y already
// offset to the block): kRowBlock rows at a time, then single rows.
template <typename K, typename W>
void ColumnBlock(const float* x, int64_t rows, int64_t k, const W* w,
                 const float* scales, float* y, int64_t ldy) {
  int64_t r = 0;
  for (; r + kRowBlock <= rows; r += kRowBlock) {
    K::template Micro<kRowBlock>(x + r * k, k, w, scales, y + r * ldy, ldy);
  }
  for (; r < rows; ++r) {
    K::template Micro<1>(x + r * k, k, w, scales, y + r * ldy, ldy);
  }
}

// Columns [c0, c1) of y for every row: blocks of kColBlock columns, the odd
// columns one output at a time.
template <typename K, typename W>
void ColumnRange(const float* x, int64_t rows, int64_t k, const W* w,
                 const float* scales, int64_t cols, float* y, int64_t c0,
                 int64_t c1) {
  int64_t c = c0;
  std::vector<float> buf;
  for (; c + kColBlock <= c1; c += kColBlock) {
    const float* sc = scales == nullptr ? nullptr : scales + c;
    if constexpr (std::is_same_v<W, int8_t>) {
      if (rows >= kRowBlock) {
        ColumnBlock<K>(x, rows, k, Widened(w + c * k, kColBlock, k, &buf), sc,
                       y + c, cols);
        continue;
      }
    }
    ColumnBlock<K>(x, rows, k, w + c * k, sc, y + c, cols);
  }
  for (; c < c1; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      y[r * cols + c] = Scaled(K::One(x + r * k, k, w + c * k), scales, c);
    }
  }
}

template <typename W>
void RowGemmOf(const float* x, int64_t rows, int64_t k, const W* w,
               const float* scales, int64_t cols, float* y) {
  if (rows <= 0 || cols <= 0) return;
  // Blocks of columns per task: each thread streams its slice of w once per
  // four rows, from cache after the first.
  const int64_t blocks = (cols + kColBlock - 1) / kColBlock;
  const int64_t grain =
      std::max<int64_t>(1, 16384 / std::max<int64_t>(1, k * kColBlock));
  const bool avx512 = ops::KernelIsa() == ops::CpuIsa::kAvx512;
  ThreadPool::Global().ParallelFor(blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t c0 = b0 * kColBlock, c1 = std::min(cols, b1 * kColBlock);
    if (avx512) {
      ColumnRange<Avx512Kernels>(x, rows, k, w, scales, cols, y, c0, c1);
    } else {
      ColumnRange<Avx2Kernels>(x, rows, k, w, scales, cols, y, c0, c1);
    }
  });
}

}  // namespace

float FixedOrderDot(const float* a, const float* b, int64_t n) {
  return ops::KernelIsa() == ops::CpuIsa::kAvx512 ? OneOutput512(a, n, b)
                                                  : OneOutput(a, n, b);
}

void RowGemm(const float* x, int64_t rows, int64_t k, const float* w,
             int64_t cols, float* y) {
  RowGemmOf(x, rows, k, w, nullptr, cols, y);
}

void RowGemmInt8(const float* x, int64_t rows, int64_t k, const int8_t* q,
                 const float* scales, int64_t cols, float* y) {
  RowGemmOf(x, rows, k, q, scales, cols, y);
}

}  // namespace inference
}  // namespace mcc
