#ifndef TOOLS_FLAGS_TRAIN_CONFIG_FROM_FLAGS_H_
#define TOOLS_FLAGS_TRAIN_CONFIG_FROM_FLAGS_H_

#include "absl/status/statusor.h"
#include "training/train_config.pb.h"

namespace mcc {
namespace flags {

// The run the command line describes: every TrainConfig field whose flag
// this binary registers takes the flag's current value (so --config, presets
// and defaults all arrive as the flags hold them); fields without a flag in
// this binary keep the proto's default, which is the flag's (a test checks
// the two agree). Errors name the flag whose value does not fit its field.
absl::StatusOr<training::TrainConfig> TrainConfigFromFlags();

}  // namespace flags
}  // namespace mcc

#endif  // TOOLS_FLAGS_TRAIN_CONFIG_FROM_FLAGS_H_
