// Device code of the weight-only FP8 kernels (QuantizeWeightFp8 and
// Fp8WeightGemm, core/ops/fp8_weight.h), apart from their launchers
// (fp8_weight.cu) so that the host emulator (cuda_emulator.h) runs them
// against the CPU kernels in CI. The includer provides CUDA's keywords and
// thread indices, __syncthreads, __shfl_xor_sync, internal::LoadAs /
// StoreAs (kernel_util.cuh) and fp8w::SharedFloats() (the block's dynamic
// shared memory).
//
// Codes are E4M3 bit patterns in int8 storage. Encoding and decoding use
// integer and power-of-two arithmetic only, so they are core/fp8.h's
// FloatToFp8 / Fp8ToFloat bit for bit whatever the compiler contracts; the
// one product (w * s) and the divisions are correctly rounded fp32
// operations, as the CPU kernel's. The GEMM decodes each code as it loads
// it (no dequantised copy of the weight), sums in fp32 and multiplies by
// the fp32 reciprocal of the scale once, as the CPU kernel; only the sum's
// order differs.
#ifndef CORE_OPS_CUDA_FP8_WEIGHT_KERNELS_CUH_
#define CORE_OPS_CUDA_FP8_WEIGHT_KERNELS_CUH_

#include <cstdint>
#include <cstring>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {
namespace fp8w {

#ifdef __CUDACC__
__device__ __forceinline__ float MulRn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ float DivRn(float a, float b) {
  return __fdiv_rn(a, b);
}
__device__ __forceinline__ uint32_t BitsOf(float f) {
  return __float_as_uint(f);
}
__device__ __forceinline__ float FloatOf(uint32_t u) {
  return __uint_as_float(u);
}
__device__ __forceinline__ void AtomicMinKey(unsigned long long* p,
                                             unsigned long long v) {
  atomicMin(p, v);
}
#else
inline float MulRn(float a, float b) { return a * b; }
inline float DivRn(float a, float b) { return a / b; }
inline uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float FloatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
// The emulator runs one fiber at a time and switches only at barriers.
inline void AtomicMinKey(unsigned long long* p, unsigned long long v) {
  if (v < *p) *p = v;
}
#endif

constexpr float kE4M3Max = 448.0f;

// core/fp8.h's FloatToFp8(f, kE4M3): round to nearest even, saturate at
// +-448 (infinities too), NaN -> sign | 0x7f.
__device__ __forceinline__ uint8_t EncodeE4M3(float f) {
  const uint32_t u = BitsOf(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs_bits = u & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | 0x7f;
  const float a = FloatOf(abs_bits);
  if (a >= kE4M3Max) return sign | 0x7e;
  if (abs_bits < (121u << 23)) {  // Below 2^-6, the smallest normal.
    // Units of 2^-9 (a power-of-two scaling: exact), then ties to even; 8
    // units is the smallest normal's code, so the carry needs no care.
    const float units = a * FloatOf((127u + 9u) << 23);
    const uint32_t whole = static_cast<uint32_t>(units);
    const float frac = units - static_cast<float>(whole);
    uint32_t n = whole;
    if (frac > 0.5f || (frac == 0.5f && (whole & 1u) != 0)) ++n;
    return sign | static_cast<uint8_t>(n);
  }
  constexpr int kDrop = 20;  // fp32's 23 mantissa bits to 3.
  const uint32_t odd = (abs_bits >> kDrop) & 1u;
  const uint32_t rounded =
      (abs_bits + ((1u << (kDrop - 1)) - 1u) + odd) >> kDrop;
  return sign | static_cast<uint8_t>(rounded - (120u << 3));
}

// core/fp8.h's Fp8ToFloat(code, kE4M3), exactly: 0x7f / 0xff are NaN.
__device__ __forceinline__ float DecodeE4M3(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t mag = code & 0x7fu;
  if (mag == 0x7fu) return FloatOf(sign | 0x7fc00000u);
  const uint32_t e = mag >> 3, m = mag & 7u;
  if (e == 0) {
    // m * 2^-9: m has 3 bits, so the product is exact.
    return FloatOf(sign |
                   BitsOf(static_cast<float>(m) * FloatOf((127u - 9u) << 23)));
  }
  return FloatOf(sign | ((e + 120u) << 23) | (m << 20));
}

// The error key of an offending element (r, c): row-major order, so the
// smallest key is the first offender the CPU kernel's scan meets.
__device__ __forceinline__ unsigned long long RowMajorKey(int64_t r, int64_t c,
                                                          int64_t cols) {
  return static_cast<unsigned long long>(r * cols + c);
}

struct QuantizeParams {
  const void* w = nullptr;  // [rows, cols], wt
  ElemType wt = ElemType::kF32;
  const float* absmax = nullptr;  // [rows]
  int64_t rows = 0, cols = 0;
  int8_t* codes = nullptr;            // [rows, cols]
  float* scales = nullptr;            // [rows]
  unsigned long long* bad = nullptr;  // Smallest offending key, or ~0.
};

// Blocks over rows (grid-stride), threads over a row's columns: *bad gets
// the key of the first element with !(|w| <= absmax[r]) (NaN included).
// Writes nothing else, so a failed call leaves codes and scales alone.
__device__ __forceinline__ void CheckRowsBody(const QuantizeParams& p) {
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float m = p.absmax[r];
    for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
      const float v = internal::LoadAs(p.w, p.wt, r * p.cols + c);
      if (!(fabsf(v) <= m)) {
        // A thread's columns ascend: its first offender is its smallest.
        AtomicMinKey(p.bad, RowMajorKey(r, c, p.cols));
        break;
      }
    }
  }
}

// Same grid: scales[r] = 448 / absmax[r] (1 for 0), codes = e4m3(w * s).
__device__ __forceinline__ void QuantizeRowsBody(const QuantizeParams& p) {
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const float m = p.absmax[r];
    const float s = m > 0.0f ? DivRn(kE4M3Max, m) : 1.0f;
    if (threadIdx.x == 0) p.scales[r] = s;
    int8_t* row = p.codes + r * p.cols;
    for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
      const float v = internal::LoadAs(p.w, p.wt, r * p.cols + c);
      row[c] = static_cast<int8_t>(EncodeE4M3(MulRn(v, s)));
    }
  }
}

struct GemmParams {
  const void* x = nullptr;  // [m, k], xt
  ElemType xt = ElemType::kF32;
  const int8_t* codes = nullptr;  // [n, k]
  const float* scales = nullptr;  // [n]
  void* y = nullptr;              // [m, n], yt
  ElemType yt = ElemType::kF32;
  int64_t m = 0, n = 0, k = 0;
};

__device__ __forceinline__ void StoreScaled(const GemmParams& p, int64_t i,
                                            int64_t j, float acc) {
  // 1/s rounded, then one product, as the CPU kernel.
  const float inv = DivRn(1.0f, p.scales[j]);
  internal::StoreAs(p.y, p.yt, i * p.n + j, MulRn(acc, inv));
}

// ---- Decode shapes (m <= kSkinnyRows): one warp per output column ------
// Each warp streams its weight row once, lanes over k (a warp reads 128
// consecutive codes as 4-byte words when k is a multiple of 4, else 32
// bytes), every x row's partial sum kept in registers, then a butterfly
// over the lanes. The weight is read once for all m rows, and a row's sum
// does not depend on m (batch-invariant).
constexpr int kSkinnyRows = 8;
constexpr int kSkinnyThreads = 256;

__device__ __forceinline__ void SkinnyGemmBody(const GemmParams& p) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = blockDim.x / 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * warps +
                        static_cast<int64_t>(threadIdx.x / 32);
  // Whole 4-byte words when every weight row starts on one.
  const bool packed =
      p.k % 4 == 0 && reinterpret_cast<uintptr_t>(p.codes) % 4 == 0;
  // Every lane of a warp takes the same columns: the shuffles below are
  // reached by all 32.
  for (int64_t j = first; j < p.n;
       j += static_cast<int64_t>(gridDim.x) * warps) {
    float acc[kSkinnyRows] = {};
    const int8_t* wrow = p.codes + j * p.k;
    if (packed) {
      // Four codes a lane a step (a warp reads 128 consecutive bytes); the
      // word's byte b is code 4 c4 + b (little-endian, as on the host).
      const uint32_t* words = reinterpret_cast<const uint32_t*>(wrow);
      for (int64_t c4 = lane; c4 < p.k / 4; c4 += 32) {
        const uint32_t word = words[c4];
        for (int b = 0; b < 4; ++b) {
          const float w = DecodeE4M3(static_cast<uint8_t>(word >> (8 * b)));
          const int64_t c = 4 * c4 + b;
          for (int i = 0; i < kSkinnyRows; ++i) {
            if (i < p.m) {
              acc[i] =
                  fmaf(internal::LoadAs(p.x, p.xt, i * p.k + c), w, acc[i]);
            }
          }
        }
      }
    } else {
      for (int64_t c = lane; c < p.k; c += 32) {
        const float w = DecodeE4M3(static_cast<uint8_t>(wrow[c]));
        for (int i = 0; i < kSkinnyRows; ++i) {
          if (i < p.m) {
            acc[i] = fmaf(internal::LoadAs(p.x, p.xt, i * p.k + c), w, acc[i]);
          }
        }
      }
    }
    for (int i = 0; i < kSkinnyRows; ++i) {
      if (i >= p.m) break;
      float v = acc[i];
      for (int mask = 16; mask > 0; mask /= 2) {
        v += __shfl_xor_sync(0xffffffffu, v, mask);
      }
      if (lane == 0) StoreScaled(p, i, j, v);
    }
  }
}

// ---- Other shapes: 32 x 32 output tiles, as Int8Gemm ----------------------
// kTileThreads threads as (tx = t % 32, ty = t / 32); thread (tx, ty) computes
// rows ty + 8 r of the tile in column tx. Panels of 32 along k go through
// shared memory (two [32][33] float tiles, kTileSharedBytes), the codes
// decoded on the way in. Blocks over n tiles (x) and, with a stride, m
// tiles (y). Out-of-range elements load as zeros but are never summed
// (columns past k) or stored (rows past m or n).
constexpr int kTile = 32;
constexpr int kTileThreads = 256;
constexpr int kThreadRows = kTileThreads / kTile;    // 8
constexpr int kRowsPerThread = kTile / kThreadRows;  // 4
constexpr int kPitch = kTile + 1;  // No bank conflicts down a column.
constexpr int kTileSharedBytes = 2 * kTile * kPitch * sizeof(float);

__device__ __forceinline__ void TiledGemmBody(const GemmParams& p) {
  float* xs = SharedFloats();
  float* ws = xs + kTile * kPitch;
  const int tx = threadIdx.x % kTile, ty = threadIdx.x / kTile;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t j = n0 + tx;
  for (int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTile; m0 < p.m;
       m0 += static_cast<int64_t>(gridDim.y) * kTile) {
    float acc[kRowsPerThread] = {};
    for (int64_t p0 = 0; p0 < p.k; p0 += kTile) {
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int row = ty + kThreadRows * r;
        const int64_t c = p0 + tx;
        const int64_t xi = m0 + row, wj = n0 + row;
        xs[row * kPitch + tx] = (xi < p.m && c < p.k)
                                    ? internal::LoadAs(p.x, p.xt, xi * p.k + c)
                                    : 0.0f;
        ws[row * kPitch + tx] =
            (wj < p.n && c < p.k)
                ? DecodeE4M3(static_cast<uint8_t>(p.codes[wj * p.k + c]))
                : 0.0f;
      }
      __syncthreads();
      const int64_t steps = p.k - p0 < kTile ? p.k - p0 : kTile;
      for (int64_t pp = 0; pp < steps; ++pp) {
        const float w = ws[tx * kPitch + pp];
        for (int r = 0; r < kRowsPerThread; ++r) {
          acc[r] = fmaf(xs[(ty + kThreadRows * r) * kPitch + pp], w, acc[r]);
        }
      }
      __syncthreads();
    }
    if (j < p.n) {
      for (int r = 0; r < kRowsPerThread; ++r) {
        const int64_t i = m0 + ty + kThreadRows * r;
        if (i < p.m) StoreScaled(p, i, j, acc[r]);
      }
    }
  }
}

}  // namespace fp8w
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FP8_WEIGHT_KERNELS_CUH_
