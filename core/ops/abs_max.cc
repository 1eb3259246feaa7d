#include "core/ops/abs_max.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace {

template <typename T>
float BlockAbsMax(const T* x, int64_t begin, int64_t end) {
  float m = 0.0f;
  bool nan = false;
  for (int64_t i = begin; i < end; ++i) {
    const float v = std::fabs(ToF32(x[i]));
    nan |= std::isnan(v);
    m = std::max(m, v);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

template <typename T>
float AbsMaxOf(const T* x, int64_t n) {
  std::mutex mu;
  float result = 0.0f;
  ParallelForElements(n, [&](int64_t b, int64_t e) {
    const float m = BlockAbsMax(x, b, e);
    std::lock_guard<std::mutex> lock(mu);
    if (std::isnan(m) || std::isnan(result)) {
      result = std::numeric_limits<float>::quiet_NaN();
    } else {
      result = std::max(result, m);
    }
  });
  return result;
}

absl::Status AbsMaxCpu(const Tensor& x, Tensor* amax) {
  float m = 0.0f;
  switch (x.dtype()) {
    case DType::kBFloat16:
      m = AbsMaxOf(x.data<BFloat16>(), x.numel());
      break;
    case DType::kFloat16:
      m = AbsMaxOf(x.data<Float16>(), x.numel());
      break;
    default:
      m = AbsMaxOf(x.data<float>(), x.numel());
      break;
  }
  amax->data<float>()[0] = m;
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(AbsMaxKernel, AbsMaxKernels, "AbsMax", &AbsMaxCpu);

absl::Status AbsMax(const Tensor& x, Tensor* amax) {
  ScopedOpTimer op_timer("AbsMax");
  constexpr const char* kOp = "AbsMax";
  MCC_RETURN_IF_ERROR(CheckDefined(kOp, {{"x", &x}, {"amax", amax}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(kOp, {{"x", &x}, {"amax", amax}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(kOp, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckDType(kOp, {"amax", amax}, DType::kFloat32));
  if (amax->numel() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": amax ", Brief(*amax), " must hold exactly one element"));
  }
  return AbsMaxKernels()(x.device(), x, amax);
}

}  // namespace ops
}  // namespace mcc
