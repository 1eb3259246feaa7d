#include "models/gpt/int8_quantization.h"

#include <set>

#include "core/status_macros.h"

namespace mcc {
namespace gpt {
namespace {

absl::Status ConvertChunk(GPTModel* model, parallel::Int8Source source) {
  for (int i = 0; i < model->num_local_layers(); ++i) {
    TransformerLayer* layer = model->layer(i);
    if (layer->moe() != nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          "int8 weights: layer ", model->chunk().first_layer + i,
          " is a mixture of experts, whose weights int8 does not cover"));
    }
    MCC_RETURN_IF_ERROR(layer->qkv()->ConvertToInt8(source));
    MCC_RETURN_IF_ERROR(layer->proj()->ConvertToInt8(source));
    MCC_RETURN_IF_ERROR(layer->fc1()->ConvertToInt8(source));
    MCC_RETURN_IF_ERROR(layer->fc2()->ConvertToInt8(source));
  }
  return absl::OkStatus();
}

// The int8 weights of the chunk's layers, in forward order, with the dense
// weight each replaces.
struct Quantized {
  const Parameter* dense;
  const parallel::Int8Weight* int8;
};

std::vector<Quantized> QuantizedWeights(GPTModel* model) {
  std::vector<Quantized> out;
  for (int i = 0; i < model->num_local_layers(); ++i) {
    TransformerLayer* layer = model->layer(i);
    auto add = [&](const auto* linear) {
      if (linear->int8_weight() != nullptr) {
        out.push_back({linear->weight().get(), linear->int8_weight()});
      }
    };
    add(layer->qkv());
    add(layer->proj());
    if (layer->moe() != nullptr) continue;
    add(layer->fc1());
    add(layer->fc2());
  }
  return out;
}

}  // namespace

absl::Status QuantizeLinearWeightsInt8(GPTModel* model) {
  return ConvertChunk(model, parallel::Int8Source::kQuantizeWeight);
}

absl::Status PrepareInt8Weights(GPTModel* model) {
  return ConvertChunk(model, parallel::Int8Source::kLoadLater);
}

ParameterList Int8CheckpointParameters(GPTModel* model) {
  const std::vector<Quantized> quantized = QuantizedWeights(model);
  ParameterList out;
  for (const auto& p : model->parameters()) {
    const Quantized* hit = nullptr;
    for (const Quantized& q : quantized) {
      if (q.dense == p.get()) hit = &q;
    }
    if (hit == nullptr) {
      out.push_back(p);
    } else {
      out.push_back(hit->int8->q);
      out.push_back(hit->int8->scales);
    }
  }
  return out;
}

Int8WeightBytes CountInt8WeightBytes(GPTModel* model) {
  Int8WeightBytes bytes;
  const size_t dense = DTypeSize(model->context().dtype);
  for (const Quantized& q : QuantizedWeights(model)) {
    bytes.int8_bytes +=
        q.int8->q->value.nbytes() + q.int8->scales->value.nbytes();
    bytes.dense_bytes += q.int8->q->value.numel() * dense;
  }
  return bytes;
}

}  // namespace gpt
}  // namespace mcc
