#include "inference/checkpoint_weights.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "models/gpt/int8_quantization.h"
#include "training/checkpointing.h"

namespace mcc {
namespace inference {

absl::Status LoadCheckpointWeights(CheckpointReader& reader,
                                   const std::vector<gpt::GPTModel*>& chunks,
                                   absl::string_view quantize, bool log) {
  constexpr char kInt8[] = "int8";
  if (!quantize.empty() && quantize != kInt8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--quantize must be int8 (or empty: none), got '", quantize, "'"));
  }
  const bool int8_checkpoint = gpt::IsInt8Checkpoint(reader);
  if (int8_checkpoint) {
    ParameterList params;
    for (gpt::GPTModel* chunk : chunks) {
      MCC_RETURN_IF_ERROR(gpt::PrepareInt8Weights(chunk));
      const ParameterList p = gpt::Int8CheckpointParameters(chunk);
      params.insert(params.end(), p.begin(), p.end());
    }
    MCC_RETURN_IF_ERROR(training::LoadParameters(reader, params));
  } else {
    ParameterList params;
    for (gpt::GPTModel* chunk : chunks) {
      params.insert(params.end(), chunk->parameters().begin(),
                    chunk->parameters().end());
      // The routers' expert biases choose experts: part of the model.
      params.insert(params.end(), chunk->buffers().begin(),
                    chunk->buffers().end());
    }
    MCC_RETURN_IF_ERROR(training::LoadParameters(reader, params));
    if (quantize == kInt8) {
      for (gpt::GPTModel* chunk : chunks) {
        MCC_RETURN_IF_ERROR(gpt::QuantizeLinearWeightsInt8(chunk));
      }
    }
  }
  if (log && (int8_checkpoint || quantize == kInt8)) {
    gpt::Int8WeightBytes bytes;
    for (gpt::GPTModel* chunk : chunks) {
      const gpt::Int8WeightBytes b = gpt::CountInt8WeightBytes(chunk);
      bytes.int8_bytes += b.int8_bytes;
      bytes.dense_bytes += b.dense_bytes;
    }
    LOG(INFO) << absl::StrFormat(
        "int8 weights (%s): the decoder's linear layers take %.2f MiB instead "
        "of %.2f MiB on this rank (%.2fx less); embeddings, output layer, "
        "norms and biases unquantised",
        int8_checkpoint ? "quantised checkpoint" : "quantised at load",
        bytes.int8_bytes / 1048576.0, bytes.dense_bytes / 1048576.0,
        bytes.int8_bytes > 0
            ? static_cast<double>(bytes.dense_bytes) / bytes.int8_bytes
            : 0.0);
  }
  return absl::OkStatus();
}

}  // namespace inference
}  // namespace mcc
