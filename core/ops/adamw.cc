#include "core/ops/adamw.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {

absl::Status AdamWStep(const AdamWConfig& cfg, const Tensor& grad,
                       Tensor* param, Tensor* exp_avg, Tensor* exp_avg_sq,
                       Tensor* param16) {
  ScopedOpTimer op_timer("AdamWStep");
  const char* op = "AdamWStep";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"grad", &grad},
                                        {"param", param},
                                        {"exp_avg", exp_avg},
                                        {"exp_avg_sq", exp_avg_sq}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"param", param},
                                           {"grad", &grad},
                                           {"exp_avg", exp_avg},
                                           {"exp_avg_sq", exp_avg_sq}}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"param", param}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"grad", &grad}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"exp_avg", exp_avg}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(
      CheckDType(op, {"exp_avg_sq", exp_avg_sq}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"param", param}, {"grad", &grad}));
  MCC_RETURN_IF_ERROR(
      CheckShapeMatches(op, {"param", param}, {"exp_avg", exp_avg}));
  MCC_RETURN_IF_ERROR(
      CheckShapeMatches(op, {"param", param}, {"exp_avg_sq", exp_avg_sq}));
  if (param16 != nullptr) {
    MCC_RETURN_IF_ERROR(CheckDefined(op, {{"param16", param16}}));
    MCC_RETURN_IF_ERROR(
        CheckSameDevice(op, {{"param", param}, {"param16", param16}}));
    if (param16->dtype() != DType::kBFloat16 &&
        param16->dtype() != DType::kFloat16) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": param16 ", Brief(*param16), " must be bf16 or fp16"));
    }
    MCC_RETURN_IF_ERROR(
        CheckShapeMatches(op, {"param", param}, {"param16", param16}));
  }
  if (cfg.step < 1 || !(cfg.beta1 >= 0 && cfg.beta1 < 1) ||
      !(cfg.beta2 >= 0 && cfg.beta2 < 1) || !(cfg.eps > 0) ||
      !std::isfinite(cfg.lr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, " on param ", Brief(*param), ": bad hyperparameters: step ",
        cfg.step, " (>= 1), beta1 ", cfg.beta1, ", beta2 ", cfg.beta2,
        " (in [0, 1)), eps ", cfg.eps, " (> 0), lr ", cfg.lr));
  }
  return AdamWKernels()(param->device(), cfg, grad, param, exp_avg, exp_avg_sq,
                        param16);
}

namespace {

absl::Status AdamWCpu(const AdamWConfig& cfg, const Tensor& grad, Tensor* param,
                      Tensor* exp_avg, Tensor* exp_avg_sq, Tensor* param16) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), cfg.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), cfg.step);
  const float cfg_step = static_cast<float>(cfg.lr / bc1);
  const float cfg_ibc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  const float cfg_decay = 1.0f - cfg.lr * cfg.weight_decay;
  const float cfg_b1 = cfg.beta1, cfg_b2 = cfg.beta2, cfg_eps = cfg.eps;
  const float cfg_gs = cfg.grad_scale;
  float* p = param->data<float>();
  float* m = exp_avg->data<float>();
  float* v = exp_avg_sq->data<float>();
  // The 16-bit copy's element type, float when there is none.
  const DType copy_dtype = param16 ? param16->dtype() : DType::kFloat32;
  DispatchFloat(copy_dtype, [&](auto ctag) {
    using TC = decltype(ctag);
    TC* p16 = nullptr;
    if constexpr (!std::is_same<TC, float>::value) p16 = param16->data<TC>();
    DispatchFloat(grad.dtype(), [&](auto tag) {
      using TG = decltype(tag);
      const TG* gp = grad.data<TG>();
      ForEachBlock(param->numel(), param->numel(),
                   [&](int64_t off, int64_t, int64_t n) {
                     float gbuf[kBlock];
                     const float* g = AsF32(gp + off, n, gbuf);
                     float* pp = p + off;
                     float* mp = m + off;
                     float* vp = v + off;
                     // Locals, not captures: stores through pp/mp/vp could
                     // alias captured references and block vectorisation.
                     const float b1 = cfg_b1, b2 = cfg_b2, eps = cfg_eps;
                     const float gs = cfg_gs, decay = cfg_decay;
                     const float step_size = cfg_step, inv_sqrt_bc2 = cfg_ibc2;
                     for (int64_t i = 0; i < n; ++i) {
                       const float gi = g[i] * gs;
                       const float mi = b1 * mp[i] + (1.0f - b1) * gi;
                       const float vi = b2 * vp[i] + (1.0f - b2) * gi * gi;
                       mp[i] = mi;
                       vp[i] = vi;
                       const float denom = std::sqrt(vi) * inv_sqrt_bc2 + eps;
                       pp[i] = pp[i] * decay - step_size * mi / denom;
                     }
                     if constexpr (!std::is_same<TC, float>::value) {
                       StoreF32(pp, p16 + off, n);
                     }
                   });
    });
  });
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(AdamWKernel, AdamWKernels, "AdamWStep", &AdamWCpu);

}  // namespace ops
}  // namespace mcc
