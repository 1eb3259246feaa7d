#ifndef MODELS_GPT_INT8_QUANTIZATION_H_
#define MODELS_GPT_INT8_QUANTIZATION_H_

// Weight-only int8 inference for a GPT model chunk.
//
// Quantised: every decoder layer's linear layers, the QKV projection, the
// attention output projection, and the MLP's fc1 (SwiGLU's stacked gate and
// up projections alike) and fc2, per output channel (symmetric, fp32
// scales; core/ops/int8_quantize.h, parallel::Int8Weight). These hold all
// but the embeddings' share of the weights and run the decoding GEMMs.
// Not quantised: the word and position embeddings and the output layer
// (tied to the word embedding unless untied): a lookup table gains no speed
// from int8, the logits are the quantity perplexity and sampling read
// directly, and their weights are a small share at the sizes that matter.
// Norms and biases stay in the model's dtype too.
//
// After either call below the chunk serves inference only: its forward
// passes (Forward, LastTokenLogits, pipeline forward steps) run the int8
// GEMM, any backward fails, and the quantised layers' dense weights are
// released (Parameter::value undefined).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/parameter.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/int8_names.h"

namespace mcc {
namespace gpt {

// Quantises the chunk's loaded weights. Collective over the chunk's TP
// group (the row-parallel layers' row maxima are all-reduced), so every
// layout gets the serial model's int8 weights and scales.
absl::Status QuantizeLinearWeightsInt8(GPTModel* model);

// Turns the layers int8 without values (zeros), to be loaded from a
// quantised checkpoint through Int8CheckpointParameters. Not collective.
absl::Status PrepareInt8Weights(GPTModel* model);

// The tensors a quantised checkpoint holds for this chunk: its parameters,
// each quantised weight replaced by its int8 values (the weight's name) and
// scales (Int8ScaleName). Call after either function above.
ParameterList Int8CheckpointParameters(GPTModel* model);

// This rank's memory for the quantised layers' weights.
struct Int8WeightBytes {
  int64_t int8_bytes = 0;   // int8 values plus fp32 scales.
  int64_t dense_bytes = 0;  // The same weights in the model's dtype.
};
Int8WeightBytes CountInt8WeightBytes(GPTModel* model);

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_INT8_QUANTIZATION_H_
