#include "core/ops/int8_quantize.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace {

struct Arg {
  const char* name;
  const Tensor* tensor;
};

// Serial loops and no dependency on the thread pool: quantisation runs once
// at load, and tools that link it (convert_checkpoint) keep their flags.

// One row of w as fp32 (exact for every float dtype).
void LoadRow(const Tensor& w, int64_t r, float* dst) {
  const int64_t cols = w.size(1);
  ConvertElements(
      static_cast<const char*>(w.raw_data()) + r * cols * DTypeSize(w.dtype()),
      w.dtype(), dst, DType::kFloat32, cols);
}

void ForRows(int64_t rows, const std::function<void(int64_t, int64_t)>& fn) {
  fn(0, rows);
}

absl::Status CheckDefinedOnOneDevice(const char* op,
                                     std::initializer_list<Arg> args) {
  for (const Arg& a : args) {
    if (!a.tensor->defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", a.name, " is undefined"));
    }
    if (a.tensor->device() != args.begin()->tensor->device()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": ", a.name, " ", a.tensor->Describe(),
                       " is not on ", args.begin()->name, "'s device (",
                       args.begin()->tensor->Describe(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status RowAbsMaxCpu(const Tensor& w, Tensor* absmax) {
  const int64_t rows = w.size(0), cols = w.size(1);
  float* out = absmax->data<float>();
  std::vector<int64_t> bad(rows, -1);
  ForRows(rows, [&](int64_t begin, int64_t end) {
    std::vector<float> row(cols);
    for (int64_t r = begin; r < end; ++r) {
      LoadRow(w, r, row.data());
      float m = 0.0f;
      for (int64_t c = 0; c < cols; ++c) {
        const float a = std::fabs(row[c]);
        if (!std::isfinite(a)) bad[r] = c;
        m = std::max(m, a);
      }
      out[r] = m;
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    if (bad[r] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RowAbsMax: w ", w.Describe(), " has a non-finite value at row ", r,
          " column ", bad[r], "; it cannot be quantised"));
    }
  }
  return absl::OkStatus();
}

absl::Status QuantizeRowsInt8Cpu(const Tensor& w, const Tensor& absmax,
                                 Tensor* q, Tensor* scales) {
  const int64_t rows = w.size(0), cols = w.size(1);
  const float* m = absmax.data<float>();
  int8_t* qd = q->data<int8_t>();
  float* sd = scales->data<float>();
  std::vector<int64_t> bad(rows, -1);
  ForRows(rows, [&](int64_t begin, int64_t end) {
    std::vector<float> row(cols);
    for (int64_t r = begin; r < end; ++r) {
      LoadRow(w, r, row.data());
      const float s = m[r] / 127.0f;
      sd[r] = s;
      int8_t* qr = qd + r * cols;
      if (s == 0.0f) {
        for (int64_t c = 0; c < cols; ++c) {
          if (row[c] != 0.0f) bad[r] = c;
          qr[c] = 0;
        }
        continue;
      }
      for (int64_t c = 0; c < cols; ++c) {
        if (!(std::fabs(row[c]) <= m[r])) bad[r] = c;  // Also NaN.
        // nearbyint: the default rounding mode, ties to even.
        const float v = std::nearbyint(row[c] / s);
        qr[c] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, v)));
      }
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    if (bad[r] >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "QuantizeRowsInt8: w ", w.Describe(), " row ", r, " column ", bad[r],
          " exceeds the row maximum given (", m[r], ") or is not finite"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMatrix(const char* op, const Tensor& w) {
  if (!IsFloatingPoint(w.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": w ", w.Describe(), " must be fp32, bf16 or fp16"));
  }
  if (w.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": w ", w.Describe(), " is not a matrix [rows, cols]"));
  }
  return absl::OkStatus();
}

absl::Status CheckRowVector(const char* op, const char* name, const Tensor& w,
                            const Tensor& v) {
  if (v.dtype() != DType::kFloat32 || v.dim() != 1 || v.size(0) != w.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " ", v.Describe(), " is not fp32[",
                     w.size(0), "] for w ", w.Describe()));
  }
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(RowAbsMaxKernel, RowAbsMaxKernels, "RowAbsMax", &RowAbsMaxCpu);

MCC_KERNEL_SLOT(QuantizeRowsInt8Kernel, QuantizeRowsInt8Kernels,
                "QuantizeRowsInt8", &QuantizeRowsInt8Cpu);

absl::Status RowAbsMax(const Tensor& w, Tensor* absmax) {
  ScopedOpTimer op_timer("RowAbsMax");
  constexpr const char* kOp = "RowAbsMax";
  MCC_RETURN_IF_ERROR(
      CheckDefinedOnOneDevice(kOp, {{"w", &w}, {"absmax", absmax}}));
  MCC_RETURN_IF_ERROR(CheckMatrix(kOp, w));
  MCC_RETURN_IF_ERROR(CheckRowVector(kOp, "absmax", w, *absmax));
  return RowAbsMaxKernels()(w.device(), w, absmax);
}

absl::Status QuantizeRowsInt8(const Tensor& w, const Tensor& absmax, Tensor* q,
                              Tensor* scales) {
  ScopedOpTimer op_timer("QuantizeRowsInt8");
  constexpr const char* kOp = "QuantizeRowsInt8";
  MCC_RETURN_IF_ERROR(CheckDefinedOnOneDevice(
      kOp, {{"w", &w}, {"absmax", &absmax}, {"q", q}, {"scales", scales}}));
  MCC_RETURN_IF_ERROR(CheckMatrix(kOp, w));
  MCC_RETURN_IF_ERROR(CheckRowVector(kOp, "absmax", w, absmax));
  MCC_RETURN_IF_ERROR(CheckRowVector(kOp, "scales", w, *scales));
  if (q->dtype() != DType::kInt8 || q->shape() != w.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kOp, ": q ", q->Describe(), " is not int8 shaped as w ", w.Describe()));
  }
  return QuantizeRowsInt8Kernels()(w.device(), w, absmax, q, scales);
}

}  // namespace ops
}  // namespace mcc
