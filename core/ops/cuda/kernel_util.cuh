// Device helpers shared by the .cu files of //core/ops/cuda:kernels: bf16
// load/store (bit-exact with core/half.h: round to nearest even, NaN kept),
// launch sizes and block reductions. Included by .cu files only.
#ifndef CORE_OPS_CUDA_KERNEL_UTIL_CUH_
#define CORE_OPS_CUDA_KERNEL_UTIL_CUH_

#include <cuda_runtime.h>

#include <cstdint>

namespace mcc {
namespace cuda_kernels {
namespace internal {

__device__ __forceinline__ float Bf16BitsToFloat(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ __forceinline__ uint16_t FloatToBf16Bits(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  const uint32_t bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + bias) >> 16);
}

__device__ __forceinline__ float Load(const float* p, int64_t i) {
  return p[i];
}
__device__ __forceinline__ float Load(const uint16_t* p, int64_t i) {
  return Bf16BitsToFloat(p[i]);
}
__device__ __forceinline__ void Store(float* p, int64_t i, float v) {
  p[i] = v;
}
__device__ __forceinline__ void Store(uint16_t* p, int64_t i, float v) {
  p[i] = FloatToBf16Bits(v);
}

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements.
inline unsigned int GridFor(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 65536) blocks = 65536;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned int>(blocks);
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over a 1-D block whose size is a multiple of 32; every thread
// gets the result. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}

__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return WarpMax(v);
}

// Threads per row for row-wise kernels: a multiple of 32, at most 1024.
inline int RowThreads(int64_t cols) {
  if (cols >= 4096) return 1024;
  if (cols >= 1024) return 512;
  if (cols >= 256) return 256;
  return 128;
}

}  // namespace internal
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_KERNEL_UTIL_CUH_
