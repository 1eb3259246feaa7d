#ifndef TOOLS_MODEL_CONFIG_PROTO_H_
#define TOOLS_MODEL_CONFIG_PROTO_H_

#include "absl/status/statusor.h"
#include "checkpoint/config.pb.h"
#include "core/dtype.h"
#include "models/gpt/gpt_config.h"

namespace mcc {
namespace tools {

// The GPT configuration as checkpoint metadata stores it, and back.
checkpoint::ModelConfig ToProto(const gpt::GPTConfig& config,
                                int64_t tokenizer_vocab, DType dtype);
absl::StatusOr<gpt::GPTConfig> FromProto(const checkpoint::ModelConfig& proto);

}  // namespace tools
}  // namespace mcc

#endif  // TOOLS_MODEL_CONFIG_PROTO_H_
