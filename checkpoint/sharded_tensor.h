#ifndef CHECKPOINT_SHARDED_TENSOR_H_
#define CHECKPOINT_SHARDED_TENSOR_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/region.h"
#include "core/tensor.h"

namespace mcc {

// This rank's part of a global tensor: `local` holds the box
// [global_offsets, global_offsets + local.shape()) of a tensor whose full
// shape is global_shape. For saving, local is read; for loading, it is
// filled (it shares storage with the model's tensor).
struct ShardedTensorRef {
  std::string name;
  Shape global_shape;
  Shape global_offsets;
  Tensor local;

  // The whole tensor, held by this rank (replicated on others or not).
  static ShardedTensorRef Replicated(std::string name, Tensor t);
  // local is piece `index` of `count` equal pieces along dimension dim of
  // a tensor whose other dimensions are whole (a tensor-parallel split).
  static ShardedTensorRef SplitAlong(std::string name, Tensor local, int dim,
                                     int index, int count);

  Box box() const { return Box{global_offsets, local.shape()}; }
  // The message names the tensor and the shapes at fault.
  absl::Status Validate() const;
};

}  // namespace mcc

#endif  // CHECKPOINT_SHARDED_TENSOR_H_
