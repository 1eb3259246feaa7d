// The FP8 kernels' bodies (core/ops/cuda/fp8.cu launches them), written so
// that the CUDA emulator (cuda_emulator.h) runs them in CI: rounding to FP8
// values (core/fp8.h's RoundToFp8, bit for bit), the cast of a scaled
// operand to those values, and a block's maximum of |x| as float bits. The
// includer provides CUDA's keywords (nvcc, or the emulator) and, for the
// kernels, load/store functors.
#ifndef CORE_OPS_CUDA_FP8_KERNELS_CUH_
#define CORE_OPS_CUDA_FP8_KERNELS_CUH_

#include <cstdint>
#include <cstring>

namespace mcc {
namespace cuda_kernels {
namespace fp8 {

// A format's rounding parameters (core/fp8.cc's FormatBits).
struct Format {
  int mantissa_bits;  // 3 (E4M3) or 2 (E5M2)
  int bias;           // 7 or 15
  float max_value;    // 448 or 57344
};

inline Format E4M3() { return Format{3, 7, 448.0f}; }
inline Format E5M2() { return Format{2, 15, 57344.0f}; }

__device__ __forceinline__ uint32_t BitsOf(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

__device__ __forceinline__ float FloatOf(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

// 2^e for e in fp32's normal exponent range, exactly.
__device__ __forceinline__ float Pow2(int e) {
  return FloatOf(static_cast<uint32_t>(e + 127) << 23);
}

// f rounded to the nearest value of the format, ties to even, saturating at
// +-max (infinities too), NaN kept: the value of core/fp8.h's
// Fp8ToFloat(FloatToFp8(f)). Integer and power-of-two arithmetic only, so
// the result does not depend on the compiler's contraction choices.
__device__ __forceinline__ float RoundToFp8(float f, Format fmt) {
  const uint32_t u = BitsOf(f);
  const uint32_t sign = u & 0x80000000u;
  const uint32_t abs_bits = u & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return f;  // NaN
  const float a = FloatOf(abs_bits);
  float r;
  if (a >= fmt.max_value) {
    r = fmt.max_value;
  } else {
    const int min_normal_exp = 1 - fmt.bias;
    if (a < Pow2(min_normal_exp)) {
      // Units of the smallest subnormal, rounded to nearest even by the
      // integer rule below (a * 2^k is exact: a power-of-two scaling).
      const float units = a * Pow2(fmt.mantissa_bits - min_normal_exp);
      const uint32_t whole = static_cast<uint32_t>(units);
      const float frac = units - static_cast<float>(whole);
      uint32_t n = whole;
      if (frac > 0.5f || (frac == 0.5f && (whole & 1u) != 0)) ++n;
      r = static_cast<float>(n) * Pow2(min_normal_exp - fmt.mantissa_bits);
    } else {
      const int drop = 23 - fmt.mantissa_bits;
      const uint32_t odd = (abs_bits >> drop) & 1u;
      const uint32_t rounded =
          ((abs_bits + ((1u << (drop - 1)) - 1u) + odd) >> drop) << drop;
      r = FloatOf(rounded);
    }
  }
  return FloatOf(BitsOf(r) | sign);
}

// The code (bit pattern) of a value r that RoundToFp8 returned in `fmt`:
// core/fp8.h's FloatToFp8 of the unrounded value, NaN as its nan code.
__device__ __forceinline__ uint8_t Fp8Bits(float r, Format fmt) {
  const uint32_t u = BitsOf(r);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs_bits = u & 0x7fffffffu;
  const bool e4m3 = fmt.mantissa_bits == 3;
  if (abs_bits > 0x7f800000u) return sign | (e4m3 ? 0x7f : 0x7e);
  const int min_normal_exp = 1 - fmt.bias;
  const float a = FloatOf(abs_bits);
  if (a < Pow2(min_normal_exp)) {
    // A whole number of the smallest subnormal: exact.
    return sign |
           static_cast<uint8_t>(a * Pow2(fmt.mantissa_bits - min_normal_exp));
  }
  const int drop = 23 - fmt.mantissa_bits;
  return sign | static_cast<uint8_t>((abs_bits >> drop) -
                                     (static_cast<uint32_t>(127 - fmt.bias)
                                      << fmt.mantissa_bits));
}

// out[i] = RoundToFp8(load(i) * scale[0]) for i in [0, n), grid-stride (a
// kernel's body). The product is one fp32 rounding, as the CPU kernel's.
template <typename Load, typename Store>
__device__ __forceinline__ void CastRange(Load load, Store store,
                                          const float* scale, Format fmt,
                                          int64_t n) {
  const float s = scale[0];
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const float v = load(i) * s;
    store(i, RoundToFp8(v, fmt));
  }
}

// FP8 storage for cuBLASLt: x [rows, cols] (load) scaled, rounded and
// encoded; out (bytes) [rows, cols], or [cols, rows] when `transpose`.
// Grid-stride over the output (reads uncoalesced when transposing: not
// tuned).
template <typename Load>
__device__ __forceinline__ void CastBytesRange(Load load, uint8_t* out,
                                               const float* scale, Format fmt,
                                               int64_t rows, int64_t cols,
                                               bool transpose) {
  const float s = scale[0];
  const int64_t n = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       o < n; o += stride) {
    const int64_t i = transpose ? (o % rows) * cols + o / rows : o;
    out[o] = Fp8Bits(RoundToFp8(load(i) * s, fmt), fmt);
  }
}

// The |x| bits of one value: non-negative floats order as their bits do,
// and a NaN's bits exceed infinity's, so the maximum of the bits is the
// maximum of |x| with a NaN anywhere winning (ops::AbsMax's contract).
__device__ __forceinline__ uint32_t AbsBits(float v) {
  return BitsOf(v) & 0x7fffffffu;
}

// A kernel's body: block b writes max over its grid-stride share of [0, n)
// of bits(i) to out[b]; `scratch` is the block's shared memory of
// blockDim.x words (blockDim.x a power of two).
// The maximum is the same in every order: deterministic.
template <typename Bits>
__device__ __forceinline__ void MaxBitsBlock(Bits bits, int64_t n,
                                             uint32_t* scratch, uint32_t* out) {
  uint32_t m = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < n; i += stride) {
    const uint32_t b = bits(i);
    m = b > m ? b : m;
  }
  scratch[threadIdx.x] = m;
  __syncthreads();
  for (unsigned int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      const uint32_t other = scratch[threadIdx.x + half];
      if (other > scratch[threadIdx.x]) scratch[threadIdx.x] = other;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = scratch[0];
}

}  // namespace fp8
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FP8_KERNELS_CUH_
