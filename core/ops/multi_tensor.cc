#include "core/ops/multi_tensor.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/ops/reduce.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

// Zero elements (+0 or -0) of a float tensor.
int64_t CountZeros(const Tensor& x) {
  const int64_t n = x.numel();
  const int64_t chunk = 1 << 16;
  const int64_t parts = (n + chunk - 1) / chunk;
  std::vector<int64_t> counts(parts, 0);
  const bool wide = x.dtype() == DType::kFloat32;
  const char* base = static_cast<const char*>(x.raw_data());
  ThreadPool::Global().ParallelFor(parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t q = p0; q < p1; ++q) {
      const int64_t end = std::min(n, (q + 1) * chunk);
      int64_t z = 0;
      if (wide) {
        const uint32_t* p = reinterpret_cast<const uint32_t*>(base);
        for (int64_t i = q * chunk; i < end; ++i) z += (p[i] << 1) == 0;
      } else {
        const uint16_t* p = reinterpret_cast<const uint16_t*>(base);
        for (int64_t i = q * chunk; i < end; ++i)
          z += static_cast<uint16_t>(p[i] << 1) == 0;
      }
      counts[q] = z;
    }
  });
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  return total;
}

void SplitDouble(double v, float* hi, float* lo) {
  *hi = static_cast<float>(v);
  *lo = static_cast<float>(v - static_cast<double>(*hi));
}

absl::Status MultiTensorSumOfSquaresCpu(absl::Span<const Tensor> counted,
                                        absl::Span<const Tensor> checked,
                                        const SumOfSquaresOptions& options,
                                        Tensor* out) {
  double sq = 0.0, zeros = 0.0;
  bool bad = false;
  for (const Tensor& t : counted) {
    const double s = internal::SumOfSquaresCpu(t);
    if (!std::isfinite(s)) {
      bad = true;
    } else {
      sq += s;
    }
    if (options.count_zeros) zeros += static_cast<double>(CountZeros(t));
  }
  for (const Tensor& t : checked) {
    if (!std::isfinite(internal::SumOfSquaresCpu(t))) bad = true;
  }
  sq *= options.scale * options.scale;
  float* o = out->data<float>();
  if (bad) {
    o[0] = std::numeric_limits<float>::infinity();
    o[1] = 0.0f;
  } else {
    SplitDouble(sq, &o[0], &o[1]);
  }
  SplitDouble(zeros, &o[2], &o[3]);
  return absl::OkStatus();
}

absl::Status CheckList(const char* op, const char* list,
                       absl::Span<const Tensor> ts, const Tensor& out) {
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string name = absl::StrCat(list, "[", i, "]");
    MCC_RETURN_IF_ERROR(CheckDefined(op, {{name.c_str(), &ts[i]}}));
    MCC_RETURN_IF_ERROR(
        CheckSameDevice(op, {{"out", &out}, {name.c_str(), &ts[i]}}));
    MCC_RETURN_IF_ERROR(CheckFloatDType(op, {name.c_str(), &ts[i]}));
  }
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(MultiTensorSumOfSquaresKernel, MultiTensorSumOfSquaresKernels,
                "MultiTensorSumOfSquares", &MultiTensorSumOfSquaresCpu);

absl::Status MultiTensorSumOfSquares(absl::Span<const Tensor> counted,
                                     absl::Span<const Tensor> checked,
                                     const SumOfSquaresOptions& options,
                                     Tensor* out) {
  ScopedOpTimer op_timer("MultiTensorSumOfSquares");
  const char* op = "MultiTensorSumOfSquares";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"out", out}}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"out", out}, DType::kFloat32));
  if (out->numel() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": out ", Brief(*out), " must have 4 elements"));
  }
  MCC_RETURN_IF_ERROR(CheckList(op, "counted", counted, *out));
  MCC_RETURN_IF_ERROR(CheckList(op, "checked", checked, *out));
  if (!std::isfinite(options.scale)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": scale ", options.scale, " is not finite"));
  }
  return MultiTensorSumOfSquaresKernels()(out->device(), counted, checked,
                                          options, out);
}

}  // namespace ops
}  // namespace mcc
