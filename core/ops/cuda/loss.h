// Launchers for the loss-sum CUDA kernels of //core/ops/cuda:kernels (the
// LossSum and LossSumGradient slots, core/ops/loss_sum.h). Conventions as in
// elementwise.h. The loss sum is fp32 [4]: two float64 values, each as two
// fp32 halves (hi = float(v), lo = float(v - hi)).
#ifndef CORE_OPS_CUDA_LOSS_H_
#define CORE_OPS_CUDA_LOSS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// out[0..1] = the sum over tokens t with labels[t] != ignore_index of
// double(loss[t]) * mask[t] (mask null: 1), out[2..3] = the sum of those
// mask values, each accumulated in float64 in token order exactly as the
// CPU kernel does (so the bits agree on every device), plus the values
// already in out when accumulate. labels are int32 or int64 (lt). One
// block: the products are formed in parallel, then added by one thread in
// order, about 5 ns a token.
cudaError_t LossSum(const float* loss, const float* mask, const void* labels,
                    ElemType lt, int64_t tokens, int64_t ignore_index,
                    bool accumulate, float* out, cudaStream_t stream);

// dloss[t] = mask[t] * s (s without a mask), s = grad_scale /
// float(out[2] + out[3]) as the CPU computes it, 0 when that count is 0.
cudaError_t LossSumGradient(const float* loss_sum, const float* mask,
                            float grad_scale, float* dloss, int64_t tokens,
                            cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_LOSS_H_
