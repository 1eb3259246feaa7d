#include "core/ops/loss_sum.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace {

double Join(const float* p) {
  return static_cast<double>(p[0]) + static_cast<double>(p[1]);
}

void SplitInto(double v, float* p) {
  p[0] = static_cast<float>(v);
  p[1] = static_cast<float>(v - static_cast<double>(p[0]));
}

template <typename L>
void SumTokens(const float* lp, const float* mp, const L* yp, int64_t n,
               int64_t ignore_index, double* sum, double* tokens) {
  for (int64_t t = 0; t < n; ++t) {
    if (static_cast<int64_t>(yp[t]) == ignore_index) continue;
    const float m = mp != nullptr ? mp[t] : 1.0f;
    *sum += static_cast<double>(lp[t]) * m;
    *tokens += m;
  }
}

absl::Status LossSumCpu(const Tensor& loss, const Tensor& mask,
                        const Tensor& labels, int64_t ignore_index,
                        bool accumulate, Tensor* out) {
  float* o = out->data<float>();
  double sum = 0.0, tokens = 0.0;
  const float* mp = mask.defined() ? mask.data<float>() : nullptr;
  if (labels.dtype() == DType::kInt32) {
    SumTokens(loss.data<float>(), mp, labels.data<int32_t>(), loss.numel(),
              ignore_index, &sum, &tokens);
  } else {
    SumTokens(loss.data<float>(), mp, labels.data<int64_t>(), loss.numel(),
              ignore_index, &sum, &tokens);
  }
  if (accumulate) {
    sum += Join(o);
    tokens += Join(o + 2);
  }
  SplitInto(sum, o);
  SplitInto(tokens, o + 2);
  return absl::OkStatus();
}

absl::Status LossSumGradientCpu(const Tensor& loss_sum, const Tensor& mask,
                                float grad_scale, Tensor* dloss) {
  const double tokens = Join(loss_sum.data<float>() + 2);
  const float s = tokens > 0 ? grad_scale / static_cast<float>(tokens) : 0.0f;
  float* dp = dloss->data<float>();
  const int64_t n = dloss->numel();
  if (mask.defined()) {
    const float* mp = mask.data<float>();
    for (int64_t t = 0; t < n; ++t) dp[t] = mp[t] * s;
  } else {
    for (int64_t t = 0; t < n; ++t) dp[t] = s;
  }
  return absl::OkStatus();
}

absl::Status CheckPerToken(const char* op, const char* name, const Tensor& t,
                           int64_t tokens, const Tensor& ref) {
  MCC_RETURN_IF_ERROR(CheckDType(op, {name, &t}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"loss sum", &ref}, {name, &t}}));
  if (t.dim() != 1 || t.size(0) != tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " ", Brief(t), " must be [", tokens, "]"));
  }
  return absl::OkStatus();
}

absl::Status CheckLossSum(const char* op, const Tensor* out) {
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"loss sum", out}}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"loss sum", out}, DType::kFloat32));
  if (out->numel() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the loss sum ", Brief(*out), " must have 4 elements"));
  }
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(LossSumKernel, LossSumKernels, "LossSum", &LossSumCpu);

MCC_KERNEL_SLOT(LossSumGradientKernel, LossSumGradientKernels,
                "LossSumGradient", &LossSumGradientCpu);

absl::Status LossSum(const Tensor& loss, const Tensor& mask,
                     const Tensor& labels, int64_t ignore_index,
                     bool accumulate, Tensor* out) {
  ScopedOpTimer op_timer("LossSum");
  const char* op = "LossSum";
  MCC_RETURN_IF_ERROR(CheckLossSum(op, out));
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"loss", &loss}, {"labels", &labels}}));
  if (loss.dim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": loss ", Brief(loss), " must be [tokens]"));
  }
  const int64_t n = loss.size(0);
  MCC_RETURN_IF_ERROR(CheckPerToken(op, "loss", loss, n, *out));
  if (mask.defined()) {
    MCC_RETURN_IF_ERROR(CheckPerToken(op, "mask", mask, n, *out));
  }
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"loss sum", out}, {"labels", &labels}}));
  if ((labels.dtype() != DType::kInt32 && labels.dtype() != DType::kInt64) ||
      labels.dim() != 1 || labels.size(0) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": labels ", Brief(labels), " must be int32 or int64 [", n, "]"));
  }
  return LossSumKernels()(out->device(), loss, mask, labels, ignore_index,
                          accumulate, out);
}

absl::Status LossSumGradient(const Tensor& loss_sum, const Tensor& mask,
                             float grad_scale, Tensor* dloss) {
  ScopedOpTimer op_timer("LossSumGradient");
  const char* op = "LossSumGradient";
  MCC_RETURN_IF_ERROR(CheckLossSum(op, &loss_sum));
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"dloss", dloss}}));
  if (dloss->dim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dloss ", Brief(*dloss), " must be [tokens]"));
  }
  const int64_t n = dloss->size(0);
  MCC_RETURN_IF_ERROR(CheckPerToken(op, "dloss", *dloss, n, loss_sum));
  if (mask.defined()) {
    MCC_RETURN_IF_ERROR(CheckPerToken(op, "mask", mask, n, loss_sum));
  }
  return LossSumGradientKernels()(loss_sum.device(), loss_sum, mask, grad_scale,
                                  dloss);
}

}  // namespace ops
}  // namespace mcc
