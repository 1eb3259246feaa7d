#ifndef TOOLS_MODEL_CONFIG_PROTO_H_
#define TOOLS_MODEL_CONFIG_PROTO_H_

#include "absl/status/statusor.h"
#include "checkpoint/config.pb.h"
#include "core/dtype.h"
#include "models/gpt/gpt_config.h"

namespace mcc {
namespace tools {

// The GPT configuration as checkpoint metadata stores it, and back. The
// checkpoint records the true vocabulary (its tensors hold only those rows);
// padding for TP is the loading run's choice (its
// make_vocab_size_divisible_by is left at the default by FromProto).
checkpoint::ModelConfig ToProto(const gpt::GPTConfig& config, DType dtype);
absl::StatusOr<gpt::GPTConfig> FromProto(const checkpoint::ModelConfig& proto);

}  // namespace tools
}  // namespace mcc

#endif  // TOOLS_MODEL_CONFIG_PROTO_H_
