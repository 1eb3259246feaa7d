#ifndef TOOLS_FLAGS_EVAL_CONFIG_FROM_FLAGS_H_
#define TOOLS_FLAGS_EVAL_CONFIG_FROM_FLAGS_H_

#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "training/eval_config.pb.h"

namespace mcc {
namespace flags {

// The evaluation the command line describes. Every field whose flag this
// binary registers takes the flag's value; in `run` (the TrainConfig) a
// field is set only when its flag was given (named in `explicitly_set`, or
// holding other than its default), since EvaluateCheckpoint reads presence
// there: given model flags are checked against the checkpoint. Errors name
// the flag whose value does not fit its field.
absl::StatusOr<training::EvalConfig> EvalConfigFromFlags(
    const std::set<std::string>& explicitly_set);

}  // namespace flags
}  // namespace mcc

#endif  // TOOLS_FLAGS_EVAL_CONFIG_FROM_FLAGS_H_
