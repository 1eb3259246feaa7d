#include "models/gpt/int8_checkpoint_writer.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/dist_context.h"
#include "core/ops/int8_quantize.h"
#include "core/status_macros.h"
#include "models/gpt/int8_names.h"

namespace mcc {
namespace gpt {
namespace {

constexpr char kQuantizationKey[] = "quantization";
constexpr char kInt8[] = "int8";

}  // namespace

bool IsInt8Checkpoint(const CheckpointReader& reader) {
  const auto& extra = reader.common_state().extra();
  auto it = extra.find(kQuantizationKey);
  return it != extra.end() && it->second == kInt8;
}

absl::Status WriteInt8Checkpoint(CheckpointReader& reader,
                                 const std::string& save_dir) {
  if (IsInt8Checkpoint(reader)) {
    return absl::FailedPreconditionError(
        absl::StrCat(reader.path(), " is already quantised to int8"));
  }
  std::vector<ShardedTensorRef> refs;
  int quantized = 0;
  for (const std::string& name : reader.TensorNames()) {
    // Inference only: the optimizer's state has no use.
    if (absl::StartsWith(name, "optimizer.")) continue;
    MCC_ASSIGN_OR_RETURN(Tensor t, reader.ReadTensor(name));
    if (!IsInt8QuantizedWeightName(name)) {
      refs.push_back(ShardedTensorRef::Replicated(name, t));
      continue;
    }
    const Shape shape = t.shape();
    if (shape.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          reader.path(), ": ", name, " ", t.Describe(), " is not a matrix"));
    }
    const Shape rows_shape(shape.begin(), shape.end() - 1);
    MCC_ASSIGN_OR_RETURN(Tensor matrix, t.Reshape({-1, shape.back()}));
    Tensor absmax = Tensor::Empty({matrix.size(0)}, DType::kFloat32);
    Tensor q = Tensor::Empty(matrix.shape(), DType::kInt8);
    Tensor scales = Tensor::Empty({matrix.size(0)}, DType::kFloat32);
    absl::Status s = ops::RowAbsMax(matrix, &absmax);
    if (s.ok()) s = ops::QuantizeRowsInt8(matrix, absmax, &q, &scales);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(reader.path(), ": ", name, ": ", s.message()));
    }
    MCC_ASSIGN_OR_RETURN(q, q.Reshape(shape));
    MCC_ASSIGN_OR_RETURN(scales, scales.Reshape(rows_shape));
    refs.push_back(ShardedTensorRef::Replicated(name, q));
    refs.push_back(
        ShardedTensorRef::Replicated(gpt::Int8ScaleName(name), scales));
    ++quantized;
  }
  if (quantized == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        reader.path(), " has no decoder linear weights to quantise"));
  }
  checkpoint::CommonState common = reader.common_state();
  (*common.mutable_extra())[kQuantizationKey] = kInt8;
  common.mutable_parallel()->set_world_size(1);
  checkpoint::RankState rank_state;
  return SaveCheckpoint(save_dir, reader.iteration(), refs, common, rank_state,
                        DistContext::Single());
}

}  // namespace gpt
}  // namespace mcc
