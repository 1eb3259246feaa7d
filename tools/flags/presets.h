#ifndef TOOLS_FLAGS_PRESETS_H_
#define TOOLS_FLAGS_PRESETS_H_

#include <set>
#include <string>

#include "absl/status/status.h"

namespace mcc {
namespace flags {

// Sets the flags a named preset gives ("bench": 6 layers, hidden 512, 8
// heads, vocabulary 8192, sequence 512, micro-batch 4, mock data, 20
// iterations; "llama-small": the same size as a Llama, see below;
// "llama-tiny": a 4-layer, hidden-64 Llama for tests), except those in
// explicitly_set. The Llama presets set the architecture (RMSNorm, SwiGLU,
// RoPE, GQA with 2 K/V head groups, untied output layer, no
// biases) and leave the data and training flags to the caller (llama-small
// also sets bench's mock data and iterations). Flags the binary does not
// define are skipped when skip_undefined (tools/plan has no training-loop
// flags), else they are an error. An empty name does nothing; an unknown one
// is an error naming --preset.
absl::Status ApplyPreset(const std::string& name,
                         const std::set<std::string>& explicitly_set,
                         bool skip_undefined = false);

}  // namespace flags
}  // namespace mcc

#endif  // TOOLS_FLAGS_PRESETS_H_
