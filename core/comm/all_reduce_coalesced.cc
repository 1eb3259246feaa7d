#include "core/comm/all_reduce_coalesced.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace mcc {
namespace comm {

absl::Status AllReduceCoalescedSync(ProcessGroup* group,
                                    const std::vector<Tensor*>& tensors,
                                    ReduceOp op) {
  if (tensors.empty()) return absl::OkStatus();
  const DType dtype = tensors[0]->dtype();
  const Device device = tensors[0]->device();
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = *tensors[i];
    if (t.dtype() != dtype || t.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "AllReduceCoalesced on group '", group->name(), "': tensor ", i,
          " is ", DTypeName(t.dtype()), " on ", t.device().ToString(),
          ", tensor 0 ", DTypeName(dtype), " on ", device.ToString(),
          " (one dtype and device for all)"));
    }
    total += t.numel();
  }
  if (tensors.size() == 1) return group->AllReduceSync(tensors[0], op);
  Tensor flat = Tensor::Empty({total}, dtype, device);
  std::vector<Tensor> slices;
  slices.reserve(tensors.size());
  int64_t at = 0;
  for (Tensor* t : tensors) {
    MCC_ASSIGN_OR_RETURN(Tensor slice, flat.Slice(at, at + t->numel()));
    MCC_RETURN_IF_ERROR(slice.CopyFrom(*t));
    slices.push_back(std::move(slice));
    at += t->numel();
  }
  MCC_RETURN_IF_ERROR(group->AllReduceSync(&flat, op));
  for (size_t i = 0; i < tensors.size(); ++i) {
    MCC_RETURN_IF_ERROR(tensors[i]->CopyFrom(slices[i]));
  }
  return absl::OkStatus();
}

}  // namespace comm
}  // namespace mcc
