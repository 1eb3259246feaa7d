#ifndef OPTIM_UPDATE_RULE_H_
#define OPTIM_UPDATE_RULE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace mcc {
namespace optim {

// --optimizer adam|sgd (Megatron's names; "adamw" is accepted for adam,
// which is AdamW: decoupled weight decay).
enum class OptimizerType { kAdam, kSgd };
absl::StatusOr<OptimizerType> ParseOptimizerType(absl::string_view name);

// What one update of one fp32 tensor needs.
struct UpdateHyper {
  float lr = 0.0f;
  float weight_decay = 0.0f;  // 0 for biases and norm weights.
  float grad_scale = 1.0f;    // 1 / loss scale times the clip factor.
  int64_t step = 1;           // 1 on the first update.
};

// The per-element rule of an optimizer over fp32 main parameters and fp32
// state tensors of the same shape (flat views of any parameter piece).
class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  // Names of the state tensors, e.g. {"exp_avg", "exp_avg_sq"}.
  virtual std::vector<std::string> StateNames() const = 0;
  // grad: fp32; param: fp32 main parameters; state: StateNames() tensors.
  // param16 (optional, bf16 or fp16) receives the updated parameters.
  virtual absl::Status Apply(const UpdateHyper& hyper, const Tensor& grad,
                             Tensor* param, std::vector<Tensor>* state,
                             Tensor* param16) const = 0;
  // Whether Apply writes param16 itself (else the caller converts).
  virtual bool Writes16BitCopy() const { return false; }
};

// AdamW (Loshchilov & Hutter), through ops::AdamWStep:
//   p *= 1 - lr wd; m, v updated; p -= lr m_hat / (sqrt(v_hat) + eps).
std::unique_ptr<UpdateRule> MakeAdamW(float beta1, float beta2, float eps);

// SGD with momentum as torch.optim.SGD (dampening 0): d = g + wd p;
// buf = d on the first step, else momentum buf + d; p -= lr buf
// (nesterov: p -= lr (d + momentum buf)). momentum 0: no state.
std::unique_ptr<UpdateRule> MakeSgd(float momentum, bool nesterov = false);

}  // namespace optim
}  // namespace mcc

#endif  // OPTIM_UPDATE_RULE_H_
