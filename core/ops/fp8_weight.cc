#include "core/ops/fp8_weight.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/fp8.h"
#include "core/op_profile.h"
#include "core/ops/abs_max.h"
#include "core/ops/gemm.h"
#include "core/ops/int8_quantize.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace {

constexpr Fp8Format kFormat = Fp8Format::kE4M3;

absl::Status QuantizeWeightFp8Cpu(const Tensor& w, const Tensor& absmax,
                                  Tensor* codes, Tensor* scales) {
  const int64_t rows = w.size(0), cols = w.size(1);
  std::vector<float> v(w.numel());
  LoadF32Any(w, v.data());
  const float* row_max = absmax.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      if (!(std::fabs(v[r * cols + c]) <= row_max[r])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "QuantizeWeightFp8: absmax[", r, "] = ", row_max[r],
            " is below |w[", r, ", ", c, "]| = ", std::fabs(v[r * cols + c])));
      }
    }
  }
  float* s = scales->data<float>();
  int8_t* q = codes->data<int8_t>();
  const float fp8_max = Fp8Max(kFormat);
  for (int64_t r = 0; r < rows; ++r) {
    s[r] = row_max[r] > 0.0f ? fp8_max / row_max[r] : 1.0f;
    for (int64_t c = 0; c < cols; ++c) {
      q[r * cols + c] =
          static_cast<int8_t>(FloatToFp8(v[r * cols + c] * s[r], kFormat));
    }
  }
  return absl::OkStatus();
}

absl::Status Fp8WeightGemmCpu(const Tensor& x, const Tensor& codes,
                              const Tensor& scales, Tensor* y) {
  const int64_t n = codes.size(0), k = codes.size(1), m = x.size(0);
  Tensor w = Tensor::Empty({n, k}, DType::kFloat32);
  float* wp = w.data<float>();
  const int8_t* q = codes.data<int8_t>();
  ParallelForElements(w.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      wp[i] = Fp8ToFloat(static_cast<uint8_t>(q[i]), kFormat);
    }
  });
  Tensor xf = x;
  if (x.dtype() != DType::kFloat32) {
    xf = Tensor::Empty(x.shape(), DType::kFloat32);
    LoadF32Any(x, xf.data<float>());
  }
  Tensor yf = y->dtype() == DType::kFloat32
                  ? *y
                  : Tensor::Empty({m, n}, DType::kFloat32);
  MCC_RETURN_IF_ERROR(Gemm(xf, false, w, true, &yf));
  const float* s = scales.data<float>();
  std::vector<float> inv(n);
  for (int64_t j = 0; j < n; ++j) inv[j] = 1.0f / s[j];
  float* yp = yf.data<float>();
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) yp[i * n + j] *= inv[j];
  }
  if (y->dtype() != DType::kFloat32) {
    ConvertElements(yp, DType::kFloat32, y->raw_data(), y->dtype(), m * n);
  }
  return absl::OkStatus();
}

}  // namespace

const char* Fp8WeightScalingName(Fp8WeightScaling scaling) {
  return scaling == Fp8WeightScaling::kPerChannel ? "per-channel"
                                                  : "per-tensor";
}

MCC_KERNEL_SLOT(QuantizeWeightFp8Kernel, QuantizeWeightFp8Kernels,
                "QuantizeWeightFp8", &QuantizeWeightFp8Cpu);
MCC_KERNEL_SLOT(Fp8WeightGemmKernel, Fp8WeightGemmKernels, "Fp8WeightGemm",
                &Fp8WeightGemmCpu);

absl::Status QuantizeWeightFp8(const Tensor& w, const Tensor& absmax,
                               Tensor* codes, Tensor* scales) {
  ScopedOpTimer op_timer("QuantizeWeightFp8");
  constexpr const char* kOp = "QuantizeWeightFp8";
  MCC_RETURN_IF_ERROR(CheckDefined(
      kOp,
      {{"w", &w}, {"absmax", &absmax}, {"codes", codes}, {"scales", scales}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(
      kOp,
      {{"w", &w}, {"absmax", &absmax}, {"codes", codes}, {"scales", scales}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(kOp, {"w", &w}));
  MCC_RETURN_IF_ERROR(CheckDType(kOp, {"absmax", &absmax}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckDType(kOp, {"codes", codes}, DType::kInt8));
  MCC_RETURN_IF_ERROR(CheckDType(kOp, {"scales", scales}, DType::kFloat32));
  if (w.dim() != 2 || codes->shape() != w.shape() || scales->dim() != 1 ||
      scales->size(0) != w.size(0) || absmax.shape() != scales->shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp,
        ": shapes do not fit w [N, K], absmax [N], codes [N, K], scales [N]: "
        "w ",
        Brief(w), ", absmax ", Brief(absmax), ", codes ", Brief(*codes),
        ", scales ", Brief(*scales)));
  }
  return QuantizeWeightFp8Kernels()(w.device(), w, absmax, codes, scales);
}

absl::Status Fp8WeightAbsMax(const Tensor& w, Fp8WeightScaling scaling,
                             Tensor* absmax) {
  MCC_RETURN_IF_ERROR(RowAbsMax(w, absmax));
  if (scaling == Fp8WeightScaling::kPerChannel) return absl::OkStatus();
  Tensor m = Tensor::Empty({1}, DType::kFloat32, absmax->device());
  MCC_RETURN_IF_ERROR(AbsMax(*absmax, &m));
  absmax->Fill(m.ToDoubles()[0]);
  return absl::OkStatus();
}

absl::Status Fp8WeightGemm(const Tensor& x, const Tensor& codes,
                           const Tensor& scales, Tensor* y) {
  ScopedOpTimer op_timer("Fp8WeightGemm");
  constexpr const char* kOp = "Fp8WeightGemm";
  MCC_RETURN_IF_ERROR(CheckDefined(
      kOp, {{"x", &x}, {"codes", &codes}, {"scales", &scales}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(
      kOp, {{"x", &x}, {"codes", &codes}, {"scales", &scales}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(kOp, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckDType(kOp, {"codes", &codes}, DType::kInt8));
  MCC_RETURN_IF_ERROR(CheckDType(kOp, {"scales", &scales}, DType::kFloat32));
  if (y->dtype() != x.dtype() && y->dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": y ", Brief(*y), " must be fp32 or x's dtype (x ",
                     Brief(x), ")"));
  }
  if (x.dim() != 2 || codes.dim() != 2 || x.size(1) != codes.size(1) ||
      scales.dim() != 1 || scales.size(0) != codes.size(0) || y->dim() != 2 ||
      y->size(0) != x.size(0) || y->size(1) != codes.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp,
        ": shapes do not fit x [M, K], codes [N, K], scales [N], y [M, N]: x ",
        Brief(x), ", codes ", Brief(codes), ", scales ", Brief(scales), ", y ",
        Brief(*y)));
  }
  return Fp8WeightGemmKernels()(x.device(), x, codes, scales, y);
}

}  // namespace ops
}  // namespace mcc
