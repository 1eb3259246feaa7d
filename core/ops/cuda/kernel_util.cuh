// Device helpers shared by the .cu files of //core/ops/cuda:kernels: bf16 and
// fp16 load/store (bit-exact with core/half.h: round to nearest even, NaN
// kept, fp16 subnormals kept), loads and stores by run-time element type,
// launch sizes and block reductions. Included by .cu files only.
#ifndef CORE_OPS_CUDA_KERNEL_UTIL_CUH_
#define CORE_OPS_CUDA_KERNEL_UTIL_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

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

__device__ __forceinline__ float Fp16BitsToFloat(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}

// __float2half_rn rounds to nearest even, overflows to infinity and keeps
// subnormals, as core/half.h's FloatToFloat16 does.
__device__ __forceinline__ uint16_t FloatToFp16Bits(float f) {
  return __half_as_ushort(__float2half_rn(f));
}

// Element i of a float tensor of run-time type t, as fp32. The switch is
// uniform across a warp (one tensor, one type), so it costs a few
// instructions per element, hidden behind memory in these bandwidth-bound
// kernels.
__device__ __forceinline__ float LoadAs(const void* p, ElemType t, int64_t i) {
  switch (t) {
    case ElemType::kBF16:
      return Bf16BitsToFloat(static_cast<const uint16_t*>(p)[i]);
    case ElemType::kF16:
      return Fp16BitsToFloat(static_cast<const uint16_t*>(p)[i]);
    case ElemType::kI32:
      return static_cast<float>(static_cast<const int32_t*>(p)[i]);
    case ElemType::kI64:
      return static_cast<float>(static_cast<const int64_t*>(p)[i]);
    case ElemType::kI8:
      return static_cast<float>(static_cast<const int8_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Stores v rounded to the run-time type t (integers truncate toward zero).
__device__ __forceinline__ void StoreAs(void* p, ElemType t, int64_t i,
                                        float v) {
  switch (t) {
    case ElemType::kBF16:
      static_cast<uint16_t*>(p)[i] = FloatToBf16Bits(v);
      break;
    case ElemType::kF16:
      static_cast<uint16_t*>(p)[i] = FloatToFp16Bits(v);
      break;
    case ElemType::kI32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case ElemType::kI64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case ElemType::kI8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

constexpr int kThreads = 256;

// The index of this thread in a 1-D grid and the grid's stride, for
// grid-stride loops.
__device__ __forceinline__ int64_t GlobalThread() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t GridStride() {
  return int64_t{gridDim.x} * blockDim.x;
}

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
