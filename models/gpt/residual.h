#ifndef MODELS_GPT_RESIDUAL_H_
#define MODELS_GPT_RESIDUAL_H_

#include "absl/status/status.h"
#include "core/tensor.h"

namespace mcc {
namespace gpt {

// y = a + b elementwise (the residual connections); fp32 or bf16, same
// shapes; y may alias a or b.
absl::Status AddResidual(const Tensor& a, const Tensor& b, Tensor* y);

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_RESIDUAL_H_
