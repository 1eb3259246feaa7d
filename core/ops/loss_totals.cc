#include "core/ops/loss_totals.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace {

double JoinPair(const float* p) {
  return static_cast<double>(p[0]) + static_cast<double>(p[1]);
}

void SplitPair(double v, float* p) {
  p[0] = static_cast<float>(v);
  p[1] = static_cast<float>(v - static_cast<double>(p[0]));
}

// Three fp32 parts hold any finite float64 (24 + 24 + 24 bits cover its 53;
// the remainders are exact in float64).
double JoinExact(const float* p) {
  return (static_cast<double>(p[0]) + static_cast<double>(p[1])) +
         static_cast<double>(p[2]);
}

void SplitExact(double v, float* p) {
  if (!std::isfinite(v)) {
    p[0] = static_cast<float>(v);
    p[1] = p[2] = 0.0f;
    return;
  }
  p[0] = static_cast<float>(v);
  const double r = v - static_cast<double>(p[0]);
  p[1] = static_cast<float>(r);
  p[2] = static_cast<float>(r - static_cast<double>(p[1]));
}

absl::Status AccumulateLossTotalsCpu(const Tensor& loss_sum,
                                     int num_microbatches, Tensor* totals) {
  const float* in = loss_sum.data<float>();
  float* t = totals->data<float>();
  const double sum = JoinPair(in);
  const double tokens = JoinPair(in + 2);
  const double mean = tokens > 0 ? sum / tokens : 0.0;
  SplitExact(JoinExact(t) + mean / static_cast<double>(num_microbatches), t);
  SplitExact(JoinExact(t + 3) + sum, t + 3);
  SplitExact(JoinExact(t + 6) + tokens, t + 6);
  return absl::OkStatus();
}

absl::Status PackLossTotalsCpu(const Tensor& totals, Tensor* packed) {
  const float* t = totals.data<float>();
  float* p = packed->data<float>();
  for (int i = 0; i < 3; ++i) SplitPair(JoinExact(t + 3 * i), p + 2 * i);
  return absl::OkStatus();
}

absl::Status CheckFp32Vector(const char* op, const char* name, const Tensor* t,
                             int64_t n) {
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{name, t}}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {name, t}, DType::kFloat32));
  if (t->numel() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " ", Brief(*t), " must have ", n, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(AccumulateLossTotalsKernel, AccumulateLossTotalsKernels,
                "AccumulateLossTotals", &AccumulateLossTotalsCpu);

MCC_KERNEL_SLOT(PackLossTotalsKernel, PackLossTotalsKernels, "PackLossTotals",
                &PackLossTotalsCpu);

absl::Status AccumulateLossTotals(const Tensor& loss_sum, int num_microbatches,
                                  Tensor* totals) {
  ScopedOpTimer op_timer("AccumulateLossTotals");
  const char* op = "AccumulateLossTotals";
  MCC_RETURN_IF_ERROR(CheckFp32Vector(op, "loss sum", &loss_sum, 4));
  MCC_RETURN_IF_ERROR(CheckFp32Vector(op, "totals", totals, kLossTotalsSize));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"totals", totals}, {"loss sum", &loss_sum}}));
  if (num_microbatches <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", num_microbatches, " micro-batches (must be > 0)"));
  }
  return AccumulateLossTotalsKernels()(totals->device(), loss_sum,
                                       num_microbatches, totals);
}

absl::Status PackLossTotals(const Tensor& totals, Tensor* packed) {
  ScopedOpTimer op_timer("PackLossTotals");
  const char* op = "PackLossTotals";
  MCC_RETURN_IF_ERROR(CheckFp32Vector(op, "totals", &totals, kLossTotalsSize));
  MCC_RETURN_IF_ERROR(
      CheckFp32Vector(op, "packed totals", packed, kPackedLossTotalsSize));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"packed totals", packed}, {"totals", &totals}}));
  return PackLossTotalsKernels()(packed->device(), totals, packed);
}

absl::StatusOr<LossTotalValues> LossTotalsFromHost(
    absl::Span<const float> values) {
  LossTotalValues out;
  if (values.size() == static_cast<size_t>(kLossTotalsSize)) {
    out.mean_of_means = JoinExact(&values[0]);
    out.sum = JoinExact(&values[3]);
    out.tokens = JoinExact(&values[6]);
  } else if (values.size() == static_cast<size_t>(kPackedLossTotalsSize)) {
    out.mean_of_means = JoinPair(&values[0]);
    out.sum = JoinPair(&values[2]);
    out.tokens = JoinPair(&values[4]);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss totals: ", values.size(), " values (want ", kLossTotalsSize,
        " or, packed, ", kPackedLossTotalsSize, ")"));
  }
  return out;
}

}  // namespace ops
}  // namespace mcc
