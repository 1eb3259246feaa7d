#ifndef TOOLS_FLAGS_QUANTIZE_FLAG_H_
#define TOOLS_FLAGS_QUANTIZE_FLAG_H_

// --quantize of eval and serve (convert_checkpoint has its own, for writing
// a quantised checkpoint); its meaning: inference/checkpoint_weights.h.

#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, quantize);

#endif  // TOOLS_FLAGS_QUANTIZE_FLAG_H_
