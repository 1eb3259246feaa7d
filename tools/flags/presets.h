#ifndef TOOLS_FLAGS_PRESETS_H_
#define TOOLS_FLAGS_PRESETS_H_

#include <set>
#include <string>

#include "absl/status/status.h"

namespace mcc {
namespace flags {

// Sets the flags a named preset gives ("bench": 6 layers, hidden 512, 8
// heads, vocabulary 8192, sequence 512, micro-batch 4, mock data, 20
// iterations), except those in explicitly_set. Flags the binary does not
// define are skipped when skip_undefined (tools/plan has no training-loop
// flags), else they are an error. An empty name does nothing; an unknown one
// is an error naming --preset.
absl::Status ApplyPreset(const std::string& name,
                         const std::set<std::string>& explicitly_set,
                         bool skip_undefined = false);

}  // namespace flags
}  // namespace mcc

#endif  // TOOLS_FLAGS_PRESETS_H_
