#ifndef MODELS_GPT_MOE_LAYER_PATTERN_H_
#define MODELS_GPT_MOE_LAYER_PATTERN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mcc {
namespace gpt {

// Which decoder layers are mixtures of experts, from Megatron's
// --moe-layer-freq: an integer N (layer i is MoE when i % N == 0; 1: every
// layer), or a list expression of 0s and 1s, one per layer, built from
// list literals, '+' (concatenation), '* n' (repetition) and parentheses,
// e.g. "[1,0,1,0]" or "([0]+[1]*3)" (Megatron evaluates it as Python; this
// reads that subset). Errors name --moe-layer-freq and what is wrong,
// including a list whose length is not num_layers.
absl::StatusOr<std::vector<bool>> ParseMoeLayerFreq(const std::string& freq,
                                                    int num_layers);

// The pattern as "[1,0,1,0]": the checkpoint's canonical form, which
// ParseMoeLayerFreq reads back.
std::string MoeLayerPatternString(const std::vector<bool>& pattern);

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_MOE_LAYER_PATTERN_H_
