#ifndef CORE_OPS_SGD_H_
#define CORE_OPS_SGD_H_

// SGD with momentum as torch.optim.SGD documents it (dampening 0), on fp32
// main parameters, in one pass over memory:
//
//   d   = grad * grad_scale + weight_decay * param
//   buf = d on the first step, else momentum * buf + d   (with a buffer)
//   d   = nesterov ? d + momentum * buf : buf             (with a buffer)
//   param -= lr * d
//
// Arithmetic is fp32, in the order written, so every device's kernel gives
// the same bits.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

struct SgdConfig {
  float lr = 1e-2f;
  float momentum = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;  // Folds in 1 / loss_scale and a clip factor.
  bool first_step = true;   // The buffer is set to d, not blended.
};

// param fp32; grad fp32, bf16 or fp16, same element count; momentum_buffer
// (null when momentum is 0) fp32, same element count; all on one device.
// Updates param and momentum_buffer in place; the device's current stream,
// no host synchronisation.
absl::Status SgdStep(const SgdConfig& config, const Tensor& grad, Tensor* param,
                     Tensor* momentum_buffer);

using SgdKernel = absl::Status (*)(const SgdConfig& config, const Tensor& grad,
                                   Tensor* param, Tensor* momentum_buffer);
KernelSlot<SgdKernel>& SgdKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_SGD_H_
