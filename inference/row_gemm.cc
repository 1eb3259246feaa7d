#include "inference/row_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <new>
#include <type_traits>

#include "core/ops/cpu_isa.h"
#include "core/thread_pool.h"

namespace mcc {
namespace inference {
namespace {

constexpr int64_t kPanel = RowGemmWeights::kPanel;

template <typename T>
T* AlignedArray(int64_t n) {
  const size_t bytes = (static_cast<size_t>(n) * sizeof(T) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, std::max<size_t>(bytes, 64));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, std::max<size_t>(bytes, 64));
  return static_cast<T*>(p);
}

// w [cols, k] into panels [panel][k][16], zero-padded past cols.
template <typename T>
void PackPanels(const T* w, int64_t cols, int64_t k, T* out) {
  for (int64_t c = 0; c < cols; ++c) {
    T* panel = out + (c / kPanel) * k * kPanel + c % kPanel;
    for (int64_t i = 0; i < k; ++i) panel[i * kPanel] = w[c * k + i];
  }
}

// ---- The micro-kernels --------------------------------------------------
// Each computes MR rows x NP panels (16 columns each) of y with one
// accumulator lane per output and one FMA per (output, k) in increasing k:
// the register tile only decides which outputs share a loaded weight vector
// or a broadcast activation, never the arithmetic of an output.

struct Tile {
  const float* x;  // the tile's first row; row stride k
  int64_t k;
  const RowGemmWeights* w;
  int64_t p0;  // first panel
  float* y;    // y's row of the tile's first row; row stride ldy
  int64_t ldy;
};

// Lanes [0, n) of a 16-column panel at column c0 that exist.
inline int ValidColumns(const Tile& t, int64_t p) {
  return static_cast<int>(
      std::min<int64_t>(kPanel, t.w->cols() - (t.p0 + p) * kPanel));
}

#define MCC_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))

MCC_AVX512 inline __m512 Load16(const float* p) { return _mm512_load_ps(p); }
MCC_AVX512 inline __m512 Load16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
      _mm_load_si128(reinterpret_cast<const __m128i*>(p))));
}

// AVX-512: MR <= 6 rows x NP <= 4 panels: up to 24 accumulators, NP weight
// vectors and a broadcast in the 32 registers.
template <int MR, int NP, typename W>
MCC_AVX512 void Kernel512(const Tile& t) {
  const W* wp[NP];
  for (int p = 0; p < NP; ++p) {
    if constexpr (std::is_same_v<W, int8_t>) {
      wp[p] = t.w->int8_panel(t.p0 + p);
    } else {
      wp[p] = t.w->f32_panel(t.p0 + p);
    }
  }
  __m512 acc[MR][NP];
  for (int r = 0; r < MR; ++r) {
    for (int p = 0; p < NP; ++p) acc[r][p] = _mm512_setzero_ps();
  }
  const float* x = t.x;
  const int64_t k = t.k;
  for (int64_t i = 0; i < k; ++i) {
    __m512 wv[NP];
    for (int p = 0; p < NP; ++p) wv[p] = Load16(wp[p] + i * kPanel);
    for (int r = 0; r < MR; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * k + i]);
      for (int p = 0; p < NP; ++p) {
        acc[r][p] = _mm512_fmadd_ps(xb, wv[p], acc[r][p]);
      }
    }
  }
  for (int p = 0; p < NP; ++p) {
    const int n = ValidColumns(t, p);
    const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
    const int64_t c0 = (t.p0 + p) * kPanel;
    for (int r = 0; r < MR; ++r) {
      __m512 v = acc[r][p];
      if constexpr (std::is_same_v<W, int8_t>) {
        v = _mm512_mul_ps(v, _mm512_load_ps(t.w->scales_panel(t.p0 + p)));
      }
      _mm512_mask_storeu_ps(t.y + r * t.ldy + c0, m, v);
    }
  }
}

inline __m256 Load8(const float* p) { return _mm256_load_ps(p); }
inline __m256 Load8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// AVX2: MR <= 6 rows x one panel (two 8-lane vectors): 12 accumulators, two
// weight vectors and a broadcast in the 16 registers. NP is 1.
template <int MR, int NP, typename W>
void Kernel256(const Tile& t) {
  static_assert(NP == 1, "the AVX2 kernel takes one panel");
  const W* wp;
  if constexpr (std::is_same_v<W, int8_t>) {
    wp = t.w->int8_panel(t.p0);
  } else {
    wp = t.w->f32_panel(t.p0);
  }
  __m256 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  const float* x = t.x;
  const int64_t k = t.k;
  for (int64_t i = 0; i < k; ++i) {
    const __m256 w0 = Load8(wp + i * kPanel);
    const __m256 w1 = Load8(wp + i * kPanel + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xb = _mm256_set1_ps(x[r * k + i]);
      acc[r][0] = _mm256_fmadd_ps(xb, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(xb, w1, acc[r][1]);
    }
  }
  const int n = ValidColumns(t, 0);
  const int64_t c0 = t.p0 * kPanel;
  for (int r = 0; r < MR; ++r) {
    alignas(32) float out[kPanel];
    __m256 lo = acc[r][0], hi = acc[r][1];
    if constexpr (std::is_same_v<W, int8_t>) {
      const float* s = t.w->scales_panel(t.p0);
      lo = _mm256_mul_ps(lo, _mm256_load_ps(s));
      hi = _mm256_mul_ps(hi, _mm256_load_ps(s + 8));
    }
    if (n == kPanel) {
      _mm256_storeu_ps(t.y + r * t.ldy + c0, lo);
      _mm256_storeu_ps(t.y + r * t.ldy + c0 + 8, hi);
    } else {
      _mm256_store_ps(out, lo);
      _mm256_store_ps(out + 8, hi);
      std::memcpy(t.y + r * t.ldy + c0, out, n * sizeof(float));
    }
  }
}

constexpr int kMaxRows = 6;

using KernelFn = void (*)(const Tile&);

// The kernel for mr rows x np panels, per ISA and weight type.
template <typename W>
struct Avx512Table {
  template <int MR, int NP>
  MCC_AVX512 static void Fn(const Tile& t) {
    Kernel512<MR, NP, W>(t);
  }
  template <int MR>
  static constexpr std::array<KernelFn, 4> Row() {
    return {&Fn<MR, 1>, &Fn<MR, 2>, &Fn<MR, 3>, &Fn<MR, 4>};
  }
  static KernelFn Get(int mr, int np) {
    static const std::array<std::array<KernelFn, 4>, kMaxRows> table = {
        Row<1>(), Row<2>(), Row<3>(), Row<4>(), Row<5>(), Row<6>()};
    return table[mr - 1][np - 1];
  }
  static constexpr int kPanels = 4;
};

template <typename W>
struct Avx2Table {
  static KernelFn Get(int mr, int /*np*/) {
    static const std::array<KernelFn, kMaxRows> table = {
        &Kernel256<1, 1, W>, &Kernel256<2, 1, W>, &Kernel256<3, 1, W>,
        &Kernel256<4, 1, W>, &Kernel256<5, 1, W>, &Kernel256<6, 1, W>};
    return table[mr - 1];
  }
  static constexpr int kPanels = 1;
};

// Every row against groups of Table::kPanels panels, one group per task; in
// a group, the rows in blocks of at most kMaxRows, as even as possible (the
// block sizes change nothing but speed).
template <typename Table>
void Run(const float* x, int64_t rows, const RowGemmWeights& w, float* y) {
  const int64_t k = w.k(), panels = w.panels();
  constexpr int kGroup = Table::kPanels;
  const int64_t groups = (panels + kGroup - 1) / kGroup;
  const int64_t blocks = (rows + kMaxRows - 1) / kMaxRows;
  const int64_t base = rows / blocks, extra = rows % blocks;
  // About 64 KiB of weights per task, at least one group.
  const int64_t group_bytes =
      k * kPanel * kGroup * (w.is_int8() ? sizeof(int8_t) : sizeof(float));
  const int64_t grain =
      std::max<int64_t>(1, 65536 / std::max<int64_t>(1, group_bytes * rows));
  ThreadPool::Global().ParallelFor(groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = g * kGroup;
      const int np = static_cast<int>(std::min<int64_t>(kGroup, panels - p0));
      int64_t r = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const int mr = static_cast<int>(base + (b < extra ? 1 : 0));
        const Tile t{x + r * k, k, &w, p0, y + r * w.cols(), w.cols()};
        Table::Get(mr, np)(t);
        r += mr;
      }
    }
  });
}

}  // namespace

RowGemmWeights RowGemmWeights::Pack(const float* w, int64_t cols, int64_t k) {
  RowGemmWeights out;
  out.cols_ = cols;
  out.k_ = k;
  out.f32_.reset(AlignedArray<float>(out.panels() * k * kPanel));
  PackPanels(w, cols, k, out.f32_.get());
  return out;
}

RowGemmWeights RowGemmWeights::PackInt8(const int8_t* q, const float* scales,
                                        int64_t cols, int64_t k) {
  RowGemmWeights out;
  out.cols_ = cols;
  out.k_ = k;
  out.int8_.reset(AlignedArray<int8_t>(out.panels() * k * kPanel));
  PackPanels(q, cols, k, out.int8_.get());
  out.scales_.reset(AlignedArray<float>(out.panels() * kPanel));
  std::memcpy(out.scales_.get(), scales, cols * sizeof(float));
  return out;
}

void RowGemmWeights::UnpackRow(int64_t c, float* out) const {
  const float* panel = f32_panel(c / kPanel) + c % kPanel;
  for (int64_t i = 0; i < k_; ++i) out[i] = panel[i * kPanel];
}

int64_t RowGemmWeights::bytes() const {
  const int64_t values = panels() * k_ * kPanel;
  return is_int8() ? values + panels() * kPanel * 4 : values * 4;
}

void RowGemm(const float* x, int64_t rows, const RowGemmWeights& w, float* y) {
  if (rows <= 0 || w.cols() <= 0) return;
  if (w.k() == 0) {
    std::fill(y, y + rows * w.cols(), 0.0f);
    return;
  }
  const bool avx512 = ops::KernelIsa() == ops::CpuIsa::kAvx512;
  if (w.is_int8()) {
    avx512 ? Run<Avx512Table<int8_t>>(x, rows, w, y)
           : Run<Avx2Table<int8_t>>(x, rows, w, y);
  } else {
    avx512 ? Run<Avx512Table<float>>(x, rows, w, y)
           : Run<Avx2Table<float>>(x, rows, w, y);
  }
}

void RowGemm(const float* x, int64_t rows, int64_t k, const float* w,
             int64_t cols, float* y) {
  RowGemm(x, rows, RowGemmWeights::Pack(w, cols, k), y);
}

void RowGemmInt8(const float* x, int64_t rows, int64_t k, const int8_t* q,
                 const float* scales, int64_t cols, float* y) {
  RowGemm(x, rows, RowGemmWeights::PackInt8(q, scales, cols, k), y);
}

float FixedOrderDot(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s = std::fma(a[i], b[i], s);
  return s;
}

}  // namespace inference
}  // namespace mcc
