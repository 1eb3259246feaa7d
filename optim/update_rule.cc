#include "optim/update_rule.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/ops/adamw.h"
#include "core/ops/sgd.h"
#include "core/status_macros.h"

namespace mcc {
namespace optim {

absl::StatusOr<OptimizerType> ParseOptimizerType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "adam" || n == "adamw") return OptimizerType::kAdam;
  if (n == "sgd") return OptimizerType::kSgd;
  return absl::InvalidArgumentError(absl::StrCat(
      "--optimizer: unknown optimizer '", name, "' (adam or sgd)"));
}

namespace {

absl::Status CheckFlatFp32(const Tensor& t, const Tensor& like,
                           absl::string_view what) {
  if (!t.defined() || t.dtype() != DType::kFloat32 ||
      t.numel() != like.numel()) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer update: ", what, " ",
                     t.defined() ? t.Describe() : "undefined",
                     " must be fp32 with ", like.numel(), " elements"));
  }
  return absl::OkStatus();
}

class AdamW : public UpdateRule {
 public:
  AdamW(float beta1, float beta2, float eps)
      : beta1_(beta1), beta2_(beta2), eps_(eps) {}
  std::vector<std::string> StateNames() const override {
    return {"exp_avg", "exp_avg_sq"};
  }
  bool Writes16BitCopy() const override { return true; }
  absl::Status Apply(const UpdateHyper& h, const Tensor& grad, Tensor* param,
                     std::vector<Tensor>* state,
                     Tensor* param16) const override {
    if (state->size() != 2) {
      return absl::InvalidArgumentError("AdamW needs two state tensors");
    }
    ops::AdamWConfig c;
    c.lr = h.lr;
    c.beta1 = beta1_;
    c.beta2 = beta2_;
    c.eps = eps_;
    c.weight_decay = h.weight_decay;
    c.step = h.step;
    c.grad_scale = h.grad_scale;
    return ops::AdamWStep(c, grad, param, &(*state)[0], &(*state)[1], param16);
  }

 private:
  float beta1_, beta2_, eps_;
};

class Sgd : public UpdateRule {
 public:
  Sgd(float momentum, bool nesterov)
      : momentum_(momentum), nesterov_(nesterov) {}
  std::vector<std::string> StateNames() const override {
    if (momentum_ == 0.0f) return {};
    return {"momentum_buffer"};
  }
  absl::Status Apply(const UpdateHyper& h, const Tensor& grad, Tensor* param,
                     std::vector<Tensor>* state, Tensor*) const override {
    MCC_RETURN_IF_ERROR(CheckFlatFp32(*param, grad, "param"));
    MCC_RETURN_IF_ERROR(CheckFlatFp32(grad, grad, "grad"));
    Tensor* buf = nullptr;
    if (momentum_ != 0.0f) {
      if (state->size() != 1) {
        return absl::InvalidArgumentError("SGD needs one state tensor");
      }
      MCC_RETURN_IF_ERROR(CheckFlatFp32((*state)[0], grad, "momentum_buffer"));
      buf = &(*state)[0];
    }
    ops::SgdConfig c;
    c.lr = h.lr;
    c.momentum = momentum_;
    c.nesterov = nesterov_;
    c.weight_decay = h.weight_decay;
    c.grad_scale = h.grad_scale;
    c.first_step = h.step <= 1;
    return ops::SgdStep(c, grad, param, buf);
  }

 private:
  float momentum_;
  bool nesterov_;
};

}  // namespace

std::unique_ptr<UpdateRule> MakeAdamW(float beta1, float beta2, float eps) {
  return std::make_unique<AdamW>(beta1, beta2, eps);
}

std::unique_ptr<UpdateRule> MakeSgd(float momentum, bool nesterov) {
  return std::make_unique<Sgd>(momentum, nesterov);
}

}  // namespace optim
}  // namespace mcc
