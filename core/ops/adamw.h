#ifndef CORE_OPS_ADAMW_H_
#define CORE_OPS_ADAMW_H_

// Fused AdamW step (decoupled weight decay, Loshchilov & Hutter; the update
// of torch.optim.AdamW and Megatron's FusedAdam with adam_w_mode) on fp32
// main parameters and fp32 moments, in one pass over memory:
//
//   g      = grad * grad_scale
//   param  = param * (1 - lr * weight_decay)
//   m      = beta1 m + (1 - beta1) g
//   v      = beta2 v + (1 - beta2) g^2
//   param -= lr / (1 - beta1^step) * m / (sqrt(v / (1 - beta2^step)) + eps)
//
// and, when a bf16 or fp16 copy is given, writes the updated parameters to it
// too (the model's 16-bit weights in mixed-precision training).

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

struct AdamWConfig {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;         // 1 on the first update (bias correction).
  float grad_scale = 1.0f;  // Folds in 1 / loss_scale and a clip factor.
};

// param, exp_avg, exp_avg_sq: fp32, same shape; grad fp32, bf16 or fp16,
// same shape; param16 (optional) bf16 or fp16, same shape.
absl::Status AdamWStep(const AdamWConfig& config, const Tensor& grad,
                       Tensor* param, Tensor* exp_avg, Tensor* exp_avg_sq,
                       Tensor* param16 = nullptr);

// The kernel (core/ops/dispatch.h), with the op's signature: param,
// exp_avg, exp_avg_sq and param16 updated in place from their own values;
// the device's current stream, no host synchronisation.
using AdamWKernel = absl::Status (*)(const AdamWConfig& config,
                                     const Tensor& grad, Tensor* param,
                                     Tensor* exp_avg, Tensor* exp_avg_sq,
                                     Tensor* param16);
KernelSlot<AdamWKernel>& AdamWKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_ADAMW_H_
