#ifndef MODELS_GPT_INT8_NAMES_H_
#define MODELS_GPT_INT8_NAMES_H_

// The checkpoint names of weight-only int8 tensors
// (models/gpt/int8_quantization.h), apart from the model so that checkpoint
// tools can use them without linking it.

#include <string>

#include "absl/strings/string_view.h"

namespace mcc {
namespace gpt {

// Whether a checkpoint tensor is a weight the int8 scheme quantises
// ("decoder.layers.<n>.self_attention.linear_qkv.weight", linear_proj,
// mlp.linear_fc1, mlp.linear_fc2).
bool IsInt8QuantizedWeightName(absl::string_view name);
// "<weight name>_scale": the weight's fp32 per-output-row scales.
std::string Int8ScaleName(absl::string_view weight_name);

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_INT8_NAMES_H_
