#include "core/ops/cuda/kernel_util.cuh"
#include "core/ops/cuda/loss_totals.h"

namespace mcc {
namespace cuda_kernels {
namespace {

// The helpers of core/ops/loss_totals.cc, operation for operation (no
// product is formed, so no contraction into an FMA can change a bit).
__device__ double JoinPair(const float* p) {
  return static_cast<double>(p[0]) + static_cast<double>(p[1]);
}

__device__ void SplitPair(double v, float* p) {
  p[0] = static_cast<float>(v);
  p[1] = static_cast<float>(v - static_cast<double>(p[0]));
}

__device__ double JoinExact(const float* p) {
  return (static_cast<double>(p[0]) + static_cast<double>(p[1])) +
         static_cast<double>(p[2]);
}

__device__ void SplitExact(double v, float* p) {
  if (!isfinite(v)) {
    p[0] = static_cast<float>(v);
    p[1] = p[2] = 0.0f;
    return;
  }
  p[0] = static_cast<float>(v);
  const double r = v - static_cast<double>(p[0]);
  p[1] = static_cast<float>(r);
  p[2] = static_cast<float>(r - static_cast<double>(p[1]));
}

__global__ void AccumulateLossTotalsKernel(const float* in,
                                           int num_microbatches, float* t) {
  const double sum = JoinPair(in);
  const double tokens = JoinPair(in + 2);
  const double mean = tokens > 0 ? __ddiv_rn(sum, tokens) : 0.0;
  SplitExact(
      JoinExact(t) + __ddiv_rn(mean, static_cast<double>(num_microbatches)), t);
  SplitExact(JoinExact(t + 3) + sum, t + 3);
  SplitExact(JoinExact(t + 6) + tokens, t + 6);
}

__global__ void PackLossTotalsKernel(const float* t, float* p) {
  for (int i = 0; i < 3; ++i) SplitPair(JoinExact(t + 3 * i), p + 2 * i);
}

}  // namespace

cudaError_t AccumulateLossTotals(const float* loss_sum, int num_microbatches,
                                 float* totals, cudaStream_t stream) {
  AccumulateLossTotalsKernel<<<1, 1, 0, stream>>>(loss_sum, num_microbatches,
                                                  totals);
  return cudaGetLastError();
}

cudaError_t PackLossTotals(const float* totals, float* packed,
                           cudaStream_t stream) {
  PackLossTotalsKernel<<<1, 1, 0, stream>>>(totals, packed);
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
