#include "core/ops/sgd.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace {

absl::Status SgdCpu(const SgdConfig& cfg, const Tensor& grad, Tensor* param,
                    Tensor* momentum_buffer) {
  float* p = param->data<float>();
  float* buf = momentum_buffer ? momentum_buffer->data<float>() : nullptr;
  const float lr = cfg.lr, wd = cfg.weight_decay, gs = cfg.grad_scale;
  const float m = cfg.momentum;
  const bool first = cfg.first_step, nesterov = cfg.nesterov;
  DispatchFloat(grad.dtype(), [&](auto tag) {
    using TG = decltype(tag);
    const TG* gp = grad.data<TG>();
    ForEachBlock(param->numel(), param->numel(),
                 [&](int64_t off, int64_t, int64_t n) {
                   float gbuf[kBlock];
                   const float* g = AsF32(gp + off, n, gbuf);
                   float* pp = p + off;
                   float* bp = buf ? buf + off : nullptr;
                   for (int64_t i = 0; i < n; ++i) {
                     float d = g[i] * gs + wd * pp[i];
                     if (bp != nullptr) {
                       bp[i] = first ? d : m * bp[i] + d;
                       d = nesterov ? d + m * bp[i] : bp[i];
                     }
                     pp[i] -= lr * d;
                   }
                 });
  });
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(SgdKernel, SgdKernels, "SgdStep", &SgdCpu);

absl::Status SgdStep(const SgdConfig& cfg, const Tensor& grad, Tensor* param,
                     Tensor* momentum_buffer) {
  ScopedOpTimer op_timer("SgdStep");
  const char* op = "SgdStep";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"grad", &grad}, {"param", param}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"param", param}, {"grad", &grad}}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"param", param}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"grad", &grad}));
  if (grad.numel() != param->numel()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": grad ", Brief(grad),
                                                   " and param ", Brief(*param),
                                                   " differ in element count"));
  }
  if ((cfg.momentum != 0.0f) != (momentum_buffer != nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, " on param ", Brief(*param), ": momentum ", cfg.momentum,
        momentum_buffer ? " with" : " without",
        " a momentum buffer (one is needed exactly when momentum != 0)"));
  }
  if (momentum_buffer != nullptr) {
    MCC_RETURN_IF_ERROR(
        CheckDefined(op, {{"momentum_buffer", momentum_buffer}}));
    MCC_RETURN_IF_ERROR(CheckSameDevice(
        op, {{"param", param}, {"momentum_buffer", momentum_buffer}}));
    MCC_RETURN_IF_ERROR(
        CheckDType(op, {"momentum_buffer", momentum_buffer}, DType::kFloat32));
    if (momentum_buffer->numel() != param->numel()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": momentum_buffer ", Brief(*momentum_buffer), " and param ",
          Brief(*param), " differ in element count"));
    }
  }
  if (!std::isfinite(cfg.lr) || !(cfg.momentum >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, " on param ", Brief(*param), ": bad hyperparameters: lr ", cfg.lr,
        ", momentum ", cfg.momentum, " (>= 0)"));
  }
  return SgdKernels()(param->device(), cfg, grad, param, momentum_buffer);
}

}  // namespace ops
}  // namespace mcc
