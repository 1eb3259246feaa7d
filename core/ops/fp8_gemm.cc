#include "core/ops/fp8_gemm.h"

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/gemm.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace {

// x rounded to its FP8 values (unscaled, so exact in fp32): fp8(x * scale).
Tensor RoundedToFp8(const Tensor& x, Fp8Format format, float scale) {
  Tensor out = Tensor::Empty(x.shape(), DType::kFloat32);
  float* p = out.data<float>();
  LoadF32Any(x, p);
  ParallelForElements(out.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = RoundToFp8(p[i] * scale, format);
  });
  return out;
}

absl::Status Fp8GemmCpu(const Tensor& a, bool trans_a, Fp8Format a_format,
                        const Tensor& a_scale, const Tensor& b, bool trans_b,
                        Fp8Format b_format, const Tensor& b_scale, Tensor* c,
                        float alpha, float beta) {
  const float sa = a_scale.data<float>()[0];
  const float sb = b_scale.data<float>()[0];
  const Tensor a8 = RoundedToFp8(a, a_format, sa);
  const Tensor b8 = RoundedToFp8(b, b_format, sb);
  const float dequant = alpha * (1.0f / sa) * (1.0f / sb);
  return Gemm(a8, trans_a, b8, trans_b, c, dequant, beta);
}

absl::Status CheckScale(const char* op, const char* name, const Tensor& s) {
  MCC_RETURN_IF_ERROR(CheckDType(op, {name, &s}, DType::kFloat32));
  if (s.numel() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " ", Brief(s), " must hold exactly one element"));
  }
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(Fp8GemmKernel, Fp8GemmKernels, "Fp8Gemm", &Fp8GemmCpu);

absl::Status Fp8Gemm(const Tensor& a, bool trans_a, Fp8Format a_format,
                     const Tensor& a_scale, const Tensor& b, bool trans_b,
                     Fp8Format b_format, const Tensor& b_scale, Tensor* c,
                     float alpha, float beta) {
  ScopedOpTimer op_timer("Fp8Gemm");
  constexpr const char* kOp = "Fp8Gemm";
  MCC_RETURN_IF_ERROR(CheckDefined(kOp, {{"a", &a},
                                         {"a_scale", &a_scale},
                                         {"b", &b},
                                         {"b_scale", &b_scale},
                                         {"c", c}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(kOp, {{"a", &a},
                                            {"a_scale", &a_scale},
                                            {"b", &b},
                                            {"b_scale", &b_scale},
                                            {"c", c}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(kOp, {"a", &a}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(kOp, {"b", &b}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(kOp, {"c", c}));
  MCC_RETURN_IF_ERROR(CheckScale(kOp, "a_scale", a_scale));
  MCC_RETURN_IF_ERROR(CheckScale(kOp, "b_scale", b_scale));
  if (a.dim() != 2 || b.dim() != 2 || c->dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": a ", Brief(a), ", b ", Brief(b), " and c ",
                     Brief(*c), " must be 2-D matrices"));
  }
  const int64_t m = trans_a ? a.size(1) : a.size(0);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  const int64_t kb = trans_b ? b.size(1) : b.size(0);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  if (k != kb) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": a ", Brief(a), " and b ", Brief(b),
                     " (trans_a=", trans_a, ", trans_b=", trans_b,
                     "): inner dimensions differ (", k, " vs ", kb, ")"));
  }
  if (c->size(0) != m || c->size(1) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": c ", Brief(*c), " should be [", m, ", ", n,
                     "] for a ", Brief(a), " and b ", Brief(b)));
  }
  return Fp8GemmKernels()(a.device(), a, trans_a, a_format, a_scale, b, trans_b,
                          b_format, b_scale, c, alpha, beta);
}

}  // namespace ops
}  // namespace mcc
