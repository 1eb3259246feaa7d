#include "inference/checkpoint_weights.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "models/gpt/fp8_quantization.h"
#include "models/gpt/int8_quantization.h"
#include "training/checkpointing.h"

namespace mcc {
namespace inference {

absl::Status LoadCheckpointWeights(CheckpointReader& reader,
                                   const std::vector<gpt::GPTModel*>& chunks,
                                   absl::string_view quantize, bool log) {
  constexpr char kInt8[] = "int8";
  const bool fp8 = quantize == "fp8" || quantize == "fp8-per-tensor";
  if (!quantize.empty() && quantize != kInt8 && !fp8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--quantize must be int8, fp8 or fp8-per-tensor (or empty: none), "
        "got '",
        quantize, "'"));
  }
  const bool int8_checkpoint = gpt::IsInt8Checkpoint(reader);
  if (fp8 && int8_checkpoint) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--quantize ", quantize,
        ": the checkpoint is already int8 (quantise an unquantised one)"));
  }
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
    if (fp8) {
      const ops::Fp8WeightScaling scaling =
          quantize == "fp8" ? ops::Fp8WeightScaling::kPerChannel
                            : ops::Fp8WeightScaling::kPerTensor;
      gpt::Fp8WeightBytes bytes;
      for (gpt::GPTModel* chunk : chunks) {
        MCC_RETURN_IF_ERROR(gpt::QuantizeLinearWeightsFp8(chunk, scaling));
        const gpt::Fp8WeightBytes b = gpt::CountFp8WeightBytes(chunk);
        bytes.code_bytes += b.code_bytes;
        bytes.scale_bytes += b.scale_bytes;
        bytes.bf16_bytes += b.bf16_bytes;
      }
      if (log) {
        LOG(INFO) << absl::StrFormat(
            "FP8 weights (E4M3, %s scales, quantised at load): the decoder's "
            "linear layers take %.2f MiB of codes and %.3f MiB of scales "
            "instead of %.2f MiB in bf16 on this rank (%.2fx less); "
            "embeddings, output layer, norms and biases unquantised",
            ops::Fp8WeightScalingName(scaling), bytes.code_bytes / 1048576.0,
            bytes.scale_bytes / 1048576.0, bytes.bf16_bytes / 1048576.0,
            bytes.code_bytes + bytes.scale_bytes > 0
                ? static_cast<double>(bytes.bf16_bytes) /
                      (bytes.code_bytes + bytes.scale_bytes)
                : 0.0);
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
