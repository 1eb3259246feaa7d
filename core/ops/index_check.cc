#include "core/ops/index_check.h"

#include "absl/strings/str_cat.h"
#include "core/graph_capture.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace {

template <typename T>
absl::Status CheckTyped(const T* p, int64_t n, int64_t limit,
                        int64_t ignore_index, absl::string_view what) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(p[i]);
    if (id != ignore_index && (id < 0 || id >= limit)) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", id, " at token ", i,
                       " is outside the vocabulary of ", limit));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckIndexRangeCpu(const Tensor& ids, int64_t limit,
                                int64_t ignore_index, absl::string_view what) {
  if (ids.dtype() == DType::kInt32) {
    return CheckTyped(ids.data<int32_t>(), ids.numel(), limit, ignore_index,
                      what);
  }
  return CheckTyped(ids.data<int64_t>(), ids.numel(), limit, ignore_index,
                    what);
}

}  // namespace

MCC_KERNEL_SLOT(CheckIndexRangeKernel, CheckIndexRangeKernels,
                "CheckIndexRange", &CheckIndexRangeCpu);

absl::Status CheckIndexRange(const Tensor& ids, int64_t limit,
                             int64_t ignore_index, absl::string_view what) {
  ScopedOpTimer op_timer("CheckIndexRange");
  const char* op = "CheckIndexRange";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"ids", &ids}}));
  if (ids.dtype() != DType::kInt32 && ids.dtype() != DType::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ids ", Brief(ids), " must be int32 or int64"));
  }
  if (ids.numel() == 0) return absl::OkStatus();
  if (IsCapturingGraph() && !ids.device().is_cpu()) {
    // Reporting needs the ids on the host: a capture either leaves the
    // check to its caller (who checks every replay's inputs outside) or
    // refuses it.
    if (CurrentGraphCaptureOptions().index_inputs_checked_outside) {
      return absl::OkStatus();
    }
    return RefuseInsideGraphCapture(
        absl::StrCat(op, " of ", what, " (it reads the ids back)"));
  }
  return CheckIndexRangeKernels()(ids.device(), ids, limit, ignore_index, what);
}

}  // namespace ops
}  // namespace mcc
