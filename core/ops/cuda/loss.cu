#include "core/ops/cuda/kernel_util.cuh"
#include "core/ops/cuda/loss.h"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;
using internal::kThreads;

__device__ __forceinline__ double Join(const float* p) {
  return static_cast<double>(p[0]) + static_cast<double>(p[1]);
}

__device__ __forceinline__ void SplitInto(double v, float* p) {
  p[0] = static_cast<float>(v);
  p[1] = static_cast<float>(v - static_cast<double>(p[0]));
}

// Per chunk of blockDim.x tokens: every thread forms its token's terms
// (products of two floats are exact in float64), then thread 0 adds them in
// token order. A skipped token adds nothing: +0.0 leaves a sum that started
// at +0.0 unchanged, bit for bit.
__global__ void LossSumKernel(const float* loss, const float* mask,
                              const void* labels, ElemType lt, int64_t tokens,
                              int64_t ignore_index, bool accumulate,
                              float* out) {
  extern __shared__ double terms[];  // [2 * blockDim.x]
  double sum = 0.0, count = 0.0;
  for (int64_t base = 0; base < tokens; base += blockDim.x) {
    const int64_t t = base + threadIdx.x;
    double term = 0.0, weight = 0.0;
    if (t < tokens) {
      const int64_t label = lt == ElemType::kI32
                                ? static_cast<const int32_t*>(labels)[t]
                                : static_cast<const int64_t*>(labels)[t];
      if (label != ignore_index) {
        const float m = mask != nullptr ? mask[t] : 1.0f;
        term = static_cast<double>(loss[t]) * m;
        weight = m;
      }
    }
    terms[threadIdx.x] = term;
    terms[blockDim.x + threadIdx.x] = weight;
    __syncthreads();
    if (threadIdx.x == 0) {
      const int64_t n = tokens - base < blockDim.x ? tokens - base : blockDim.x;
      for (int64_t i = 0; i < n; ++i) {
        sum += terms[i];
        count += terms[blockDim.x + i];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    if (accumulate) {
      sum += Join(out);
      count += Join(out + 2);
    }
    SplitInto(sum, out);
    SplitInto(count, out + 2);
  }
}

__global__ void LossSumGradientKernel(const float* loss_sum, const float* mask,
                                      float grad_scale, float* dloss,
                                      int64_t tokens) {
  const double count = Join(loss_sum + 2);
  const float s = count > 0 ? grad_scale / static_cast<float>(count) : 0.0f;
  for (int64_t t = GlobalThread(); t < tokens; t += GridStride()) {
    dloss[t] = mask != nullptr ? mask[t] * s : s;
  }
}

}  // namespace

cudaError_t LossSum(const float* loss, const float* mask, const void* labels,
                    ElemType lt, int64_t tokens, int64_t ignore_index,
                    bool accumulate, float* out, cudaStream_t stream) {
  LossSumKernel<<<1, kThreads, 2 * kThreads * sizeof(double), stream>>>(
      loss, mask, labels, lt, tokens, ignore_index, accumulate, out);
  return cudaGetLastError();
}

cudaError_t LossSumGradient(const float* loss_sum, const float* mask,
                            float grad_scale, float* dloss, int64_t tokens,
                            cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  LossSumGradientKernel<<<GridFor(tokens), kThreads, 0, stream>>>(
      loss_sum, mask, grad_scale, dloss, tokens);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
