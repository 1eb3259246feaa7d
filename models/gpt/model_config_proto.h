#ifndef MODELS_GPT_MODEL_CONFIG_PROTO_H_
#define MODELS_GPT_MODEL_CONFIG_PROTO_H_

#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/config.pb.h"
#include "core/dtype.h"
#include "models/gpt/gpt_config.h"

namespace mcc {
namespace gpt {

// The GPT configuration as checkpoint metadata stores it, and back. The
// checkpoint records the true vocabulary (its tensors hold only those rows);
// padding for TP is the loading run's choice (its
// make_vocab_size_divisible_by is left at the default by FromProto).
checkpoint::ModelConfig ToProto(const gpt::GPTConfig& config, DType dtype);
absl::StatusOr<gpt::GPTConfig> FromProto(const checkpoint::ModelConfig& proto);

// InvalidArgument when `config` (read from the checkpoint at `path`) could
// not be that checkpoint's: a size that is not positive, or more parameter
// elements than `checkpoint_bytes` could hold at one byte an element (every
// parameter is stored, int8 at the least). Counts a lower bound in double
// (the word embedding, and per layer QKV and the projection at h x h at
// least, and the two MLP matrices), so a damaged or hostile metadata.pb is
// refused before the model it describes is allocated.
absl::Status CheckConfigFitsCheckpoint(const gpt::GPTConfig& config,
                                       int64_t checkpoint_bytes,
                                       const std::string& path);

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_MODEL_CONFIG_PROTO_H_
