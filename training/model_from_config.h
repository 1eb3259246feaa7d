#ifndef TRAINING_MODEL_FROM_CONFIG_H_
#define TRAINING_MODEL_FROM_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/fp8_scaling.h"
#include "models/gpt/gpt_config.h"
#include "parallel/linear.h"
#include "parallel/pipeline/layer_split.h"
#include "training/train_config.pb.h"

// The model and its layout that a TrainConfig describes. Errors name the
// Megatron flag (the field of the same name) at fault.

namespace mcc {
namespace training {

// The GPT for a tokenizer vocabulary of vocab_size; the model pads it for
// TP (GPTConfig::padded_vocab_size, from make_vocab_size_divisible_by).
absl::StatusOr<gpt::GPTConfig> GPTConfigFromConfig(const TrainConfig& config,
                                                   int64_t vocab_size);

// The mixture-of-experts part of GPTConfigFromConfig (--num-experts and the
// --moe-* flags) into c; refuses, by flag name, values and combinations that
// are not built (with c->num_experts 0 only the string flags are checked).
absl::Status MoeFromConfig(const TrainConfig& config, gpt::GPTConfig* c);
// Megatron's --window-size "left,right" as the model's window_left: "L,0"
// (also "(L, 0)") gives L, empty gives -1 (no window). A right window other
// than 0, or a negative left one, is refused naming the flag.
absl::StatusOr<int64_t> WindowLeftOf(const std::string& window_size);

// How num_layers splits over pipeline_model_parallel_size stages (and
// virtual stages), checked.
absl::StatusOr<pipeline::PipelineConfig> PipelineConfigFromConfig(
    const TrainConfig& config);

// cp_comm_type: p2p or a2a.
absl::StatusOr<parallel::LayerContext::CpCommType> CpCommTypeFromConfig(
    const TrainConfig& config);

// The FP8 recipe of fp8_format, fp8_recipe, fp8_margin, fp8_amax_history_len
// and fp8_amax_compute_algo (core/fp8_scaling.h); nullopt when fp8_format is
// empty.
absl::StatusOr<std::optional<Fp8Recipe>> Fp8RecipeFromConfig(
    const TrainConfig& config);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_MODEL_FROM_CONFIG_H_
