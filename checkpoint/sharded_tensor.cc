#include "checkpoint/sharded_tensor.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mcc {

ShardedTensorRef ShardedTensorRef::Replicated(std::string name, Tensor t) {
  ShardedTensorRef ref;
  ref.name = std::move(name);
  ref.global_shape = t.shape();
  ref.global_offsets.assign(t.dim(), 0);
  ref.local = std::move(t);
  return ref;
}

ShardedTensorRef ShardedTensorRef::SplitAlong(std::string name, Tensor local,
                                              int dim, int index, int count) {
  CHECK(dim >= 0 && dim < local.dim())
      << "dim " << dim << " of " << local.Describe();
  ShardedTensorRef ref;
  ref.name = std::move(name);
  ref.global_shape = local.shape();
  ref.global_shape[dim] *= count;
  ref.global_offsets.assign(local.dim(), 0);
  ref.global_offsets[dim] = local.size(dim) * index;
  ref.local = std::move(local);
  return ref;
}

absl::Status ShardedTensorRef::Validate() const {
  if (!local.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, ": local tensor is undefined"));
  }
  if (name.empty()) {
    return absl::InvalidArgumentError("a sharded tensor has an empty name");
  }
  const size_t nd = global_shape.size();
  if (local.shape().size() != nd || global_offsets.size() != nd) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", name, ": global shape ", ShapeToString(global_shape),
        ", offsets ", ShapeToString(global_offsets), " and local shape ",
        local.ShapeString(), " differ in rank"));
  }
  for (size_t d = 0; d < nd; ++d) {
    if (global_offsets[d] < 0 ||
        global_offsets[d] + local.shape()[d] > global_shape[d]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", name, ": local ", local.ShapeString(), " at offsets ",
          ShapeToString(global_offsets), " exceeds global shape ",
          ShapeToString(global_shape), " in dimension ", d));
    }
  }
  return absl::OkStatus();
}

}  // namespace mcc
