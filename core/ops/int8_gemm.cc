#include "core/ops/int8_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/cpu_isa.h"
#include "core/ops/gemm.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

std::atomic<int> g_forced_path{static_cast<int>(Int8GemmPath::kAuto)};

// Weight rows per direct tile: each converted weight vector feeds up to
// four x rows, and 4 x 4 accumulators plus operands fit the 16 (AVX2) or 32
// (AVX-512) vector registers.
constexpr int kTileRows = 4;

// ---- Portable scalar path ---------------------------------------------------

void ScalarF32(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx,
               const int8_t* q, const float* s, float* y, int64_t ldy) {
  ThreadPool::Global().ParallelFor(n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const int8_t* qj = q + j * k;
      for (int64_t i = 0; i < m; ++i) {
        const float* xi = x + i * ldx;
        float acc = 0.0f;
        for (int64_t p = 0; p < k; ++p) {
          acc += xi[p] * static_cast<float>(qj[p]);
        }
        y[i * ldy + j] = acc * s[j];
      }
    }
  });
}

// ---- AVX2 direct tile -------------------------------------------------------

inline __m256 Widen8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
      _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline float HorizontalSum8(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[MR, nr] for x rows [MR, k] and q rows (nr <= kTileRows, the rest are
// read from row 0 and dropped).
template <int MR>
void Tile256(int64_t k, const float* x, int64_t ldx, const int8_t* q,
             int64_t nr, const float* s, float* y, int64_t ldy) {
  __m256 acc[MR][kTileRows];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < kTileRows; ++j) acc[i][j] = _mm256_setzero_ps();
  }
  const int8_t* qr[kTileRows];
  for (int j = 0; j < kTileRows; ++j) qr[j] = q + (j < nr ? j : 0) * k;
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    __m256 w[kTileRows];
    for (int j = 0; j < kTileRows; ++j) w[j] = Widen8(qr[j] + p);
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + p);
      for (int j = 0; j < kTileRows; ++j) {
        acc[i][j] = _mm256_fmadd_ps(xv, w[j], acc[i][j]);
      }
    }
  }
  if (p < k) {  // Tail: zero-padded copies (zeros add nothing).
    const int64_t t = k - p;
    __m256 w[kTileRows];
    for (int j = 0; j < kTileRows; ++j) {
      int8_t buf[8] = {};
      std::memcpy(buf, qr[j] + p, t);
      w[j] = Widen8(buf);
    }
    for (int i = 0; i < MR; ++i) {
      alignas(32) float buf[8] = {};
      std::memcpy(buf, x + i * ldx + p, t * sizeof(float));
      const __m256 xv = _mm256_load_ps(buf);
      for (int j = 0; j < kTileRows; ++j) {
        acc[i][j] = _mm256_fmadd_ps(xv, w[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < nr; ++j) {
      y[i * ldy + j] = HorizontalSum8(acc[i][j]) * s[j];
    }
  }
}

// ---- AVX-512 direct tile ----------------------------------------------------

#define MCC_AVX512 __attribute__((target("avx512f,avx512vl,avx512bw,avx512dq")))

template <int MR>
MCC_AVX512 void Tile512(int64_t k, const float* x, int64_t ldx, const int8_t* q,
                        int64_t nr, const float* s, float* y, int64_t ldy) {
  __m512 acc[MR][kTileRows];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < kTileRows; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  const int8_t* qr[kTileRows];
  for (int j = 0; j < kTileRows; ++j) qr[j] = q + (j < nr ? j : 0) * k;
  int64_t p = 0;
  for (; p + 16 <= k; p += 16) {
    __m512 w[kTileRows];
    for (int j = 0; j < kTileRows; ++j) {
      w[j] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(qr[j] + p))));
    }
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + p);
      for (int j = 0; j < kTileRows; ++j) {
        acc[i][j] = _mm512_fmadd_ps(xv, w[j], acc[i][j]);
      }
    }
  }
  if (p < k) {  // Tail: masked loads read zeros past the end.
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - p)) - 1);
    __m512 w[kTileRows];
    for (int j = 0; j < kTileRows; ++j) {
      w[j] = _mm512_cvtepi32_ps(
          _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, qr[j] + p)));
    }
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + p);
      for (int j = 0; j < kTileRows; ++j) {
        acc[i][j] = _mm512_fmadd_ps(xv, w[j], acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < nr; ++j) {
      y[i * ldy + j] = _mm512_reduce_add_ps(acc[i][j]) * s[j];
    }
  }
}

template <bool kAvx512>
void TileAnyRows(int64_t mr, int64_t k, const float* x, int64_t ldx,
                 const int8_t* q, int64_t nr, const float* s, float* y,
                 int64_t ldy) {
  switch (mr) {
    case 4:
      return kAvx512 ? Tile512<4>(k, x, ldx, q, nr, s, y, ldy)
                     : Tile256<4>(k, x, ldx, q, nr, s, y, ldy);
    case 3:
      return kAvx512 ? Tile512<3>(k, x, ldx, q, nr, s, y, ldy)
                     : Tile256<3>(k, x, ldx, q, nr, s, y, ldy);
    case 2:
      return kAvx512 ? Tile512<2>(k, x, ldx, q, nr, s, y, ldy)
                     : Tile256<2>(k, x, ldx, q, nr, s, y, ldy);
    default:
      return kAvx512 ? Tile512<1>(k, x, ldx, q, nr, s, y, ldy)
                     : Tile256<1>(k, x, ldx, q, nr, s, y, ldy);
  }
}

// Parallel over tiles of weight rows; every x row tile reuses the weight
// tile from L1. Each output's sum order depends only on k, never on the
// thread count.
template <bool kAvx512>
void DirectF32(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx,
               const int8_t* q, const float* s, float* y, int64_t ldy) {
  const int64_t tiles = (n + kTileRows - 1) / kTileRows;
  // About 64 KiB of weights per chunk keeps the pool's overhead small.
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / (kTileRows * k));
  ThreadPool::Global().ParallelFor(tiles, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t n0 = t * kTileRows;
      const int64_t nr = std::min<int64_t>(kTileRows, n - n0);
      for (int64_t m0 = 0; m0 < m; m0 += 4) {
        TileAnyRows<kAvx512>(std::min<int64_t>(4, m - m0), k, x + m0 * ldx, ldx,
                             q + n0 * k, nr, s + n0, y + m0 * ldy + n0, ldy);
      }
    }
  });
}

// q converted to fp32 in panels (exact), oneDNN's sgemm, then the scales.
void DequantSgemmF32(int64_t m, int64_t n, int64_t k, const float* x,
                     int64_t ldx, const int8_t* q, const float* s, float* y,
                     int64_t ldy) {
  const int64_t panel = std::max<int64_t>(
      16, std::min<int64_t>(n, (int64_t{1} << 20) / std::max<int64_t>(1, k)));
  std::vector<float> wf(panel * k);
  for (int64_t n0 = 0; n0 < n; n0 += panel) {
    const int64_t nb = std::min(panel, n - n0);
    ParallelForRows(nb, k, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int8_t* src = q + (n0 + r) * k;
        float* dst = wf.data() + r * k;
        for (int64_t p = 0; p < k; ++p) dst[p] = static_cast<float>(src[p]);
      }
    });
    GemmF32(false, true, m, nb, k, 1.0f, x, ldx, wf.data(), k, 0.0f, y + n0,
            ldy);
  }
  ParallelForRows(m, n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float* yi = y + i * ldy;
      for (int64_t j = 0; j < n; ++j) yi[j] *= s[j];
    }
  });
}

absl::Status Int8GemmCpu(const Tensor& x, const Tensor& q, const Tensor& scales,
                         Tensor* y) {
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  if (m == 0 || n == 0) return absl::OkStatus();
  std::vector<float> x_scratch, y_scratch;
  const float* xf = nullptr;
  if (x.dtype() == DType::kFloat32) {
    xf = x.data<float>();
  } else {
    x_scratch.resize(m * k);
    LoadF32Any(x, x_scratch.data());
    xf = x_scratch.data();
  }
  float* yf = nullptr;
  if (y->dtype() == DType::kFloat32) {
    yf = y->data<float>();
  } else {
    y_scratch.resize(m * n);
    yf = y_scratch.data();
  }
  Int8GemmF32(m, n, k, xf, k, q.data<int8_t>(), scales.data<float>(), yf, n);
  if (y->dtype() == DType::kBFloat16) {
    BFloat16* out = y->data<BFloat16>();
    ParallelForElements(m * n, [&](int64_t b, int64_t e) {
      F32ToBF16(yf + b, out + b, e - b);
    });
  } else if (y->dtype() == DType::kFloat16) {
    Float16* out = y->data<Float16>();
    ParallelForElements(
        m * n, [&](int64_t b, int64_t e) { F32ToF16(yf + b, out + b, e - b); });
  }
  return absl::OkStatus();
}

}  // namespace

const char* Int8GemmPathName(Int8GemmPath path) {
  switch (path) {
    case Int8GemmPath::kAuto:
      return "auto";
    case Int8GemmPath::kScalar:
      return "scalar";
    case Int8GemmPath::kAvx2:
      return "direct AVX2";
    case Int8GemmPath::kAvx512:
      return "direct AVX-512";
    case Int8GemmPath::kDequantSgemm:
      return "dequantised sgemm";
  }
  return "unknown";
}

Int8GemmPath Int8GemmAutoPath(int64_t m) {
  if (m > kInt8DirectMaxRows) return Int8GemmPath::kDequantSgemm;
  return KernelIsa() == CpuIsa::kAvx512 ? Int8GemmPath::kAvx512
                                        : Int8GemmPath::kAvx2;
}

void Int8GemmF32(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx,
                 const int8_t* q, const float* scales, float* y, int64_t ldy,
                 Int8GemmPath path) {
  if (m <= 0 || n <= 0) return;
  if (k == 0) {  // An empty sum, on every path (they divide by k or need it).
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) y[i * ldy + j] = 0.0f * scales[j];
    }
    return;
  }
  if (path == Int8GemmPath::kAuto) {
    path = static_cast<Int8GemmPath>(g_forced_path.load());
  }
  if (path == Int8GemmPath::kAuto) path = Int8GemmAutoPath(m);
  // MCC_CPU_ISA=avx2 caps a requested AVX-512 path too.
  if (path == Int8GemmPath::kAvx512 && KernelIsa() != CpuIsa::kAvx512) {
    path = Int8GemmPath::kAvx2;
  }
  switch (path) {
    case Int8GemmPath::kScalar:
      return ScalarF32(m, n, k, x, ldx, q, scales, y, ldy);
    case Int8GemmPath::kAvx512:
      return DirectF32<true>(m, n, k, x, ldx, q, scales, y, ldy);
    case Int8GemmPath::kDequantSgemm:
      return DequantSgemmF32(m, n, k, x, ldx, q, scales, y, ldy);
    default:
      return DirectF32<false>(m, n, k, x, ldx, q, scales, y, ldy);
  }
}

MCC_KERNEL_SLOT(Int8GemmKernel, Int8GemmKernels, "Int8Gemm", &Int8GemmCpu);

absl::Status Int8Gemm(const Tensor& x, const Tensor& q, const Tensor& scales,
                      Tensor* y) {
  ScopedOpTimer op_timer("Int8Gemm");
  constexpr const char* kOp = "Int8Gemm";
  MCC_RETURN_IF_ERROR(
      CheckDefined(kOp, {{"x", &x}, {"q", &q}, {"scales", &scales}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(
      kOp, {{"x", &x}, {"q", &q}, {"scales", &scales}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(kOp, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckDType(kOp, {"q", &q}, DType::kInt8));
  MCC_RETURN_IF_ERROR(CheckDType(kOp, {"scales", &scales}, DType::kFloat32));
  if (y->dtype() != x.dtype() && y->dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": y ", Brief(*y), " must be fp32 or x's dtype (x ",
                     Brief(x), ")"));
  }
  if (x.dim() != 2 || q.dim() != 2 || x.size(1) != q.size(1) ||
      scales.dim() != 1 || scales.size(0) != q.size(0) || y->dim() != 2 ||
      y->size(0) != x.size(0) || y->size(1) != q.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": shapes do not fit x [M, K], q [N, K], scales [N], y [M, N]: x ",
        Brief(x), ", q ", Brief(q), ", scales ", Brief(scales), ", y ",
        Brief(*y)));
  }
  return Int8GemmKernels()(x.device(), x, q, scales, y);
}

namespace internal {

Int8GemmPath SetInt8GemmPathForTesting(Int8GemmPath path) {
  return static_cast<Int8GemmPath>(
      g_forced_path.exchange(static_cast<int>(path)));
}

}  // namespace internal
}  // namespace ops
}  // namespace mcc
