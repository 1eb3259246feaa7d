#include "tools/flags/presets.h"

#include <utility>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"

namespace mcc {
namespace flags {

absl::Status ApplyPreset(const std::string& name,
                         const std::set<std::string>& explicitly_set,
                         bool skip_undefined) {
  if (name.empty()) return absl::OkStatus();
  std::vector<std::pair<std::string, std::string>> values;
  if (name == "bench") {
    values = {{"num_layers", "6"},
              {"hidden_size", "512"},
              {"num_attention_heads", "8"},
              {"vocab_size", "8192"},
              {"seq_length", "512"},
              {"micro_batch_size", "4"},
              {"mock_data", "true"},
              {"train_iters", "20"},
              {"log_interval", "5"},
              {"eval_iters", "0"},
              {"make_vocab_size_divisible_by", "1"}};
  } else if (name == "llama-tiny" || name == "llama-small") {
    // The Llama architecture (models/gpt configured as Llama 2/3 and
    // Mistral are): RMSNorm, SwiGLU, rotary positions, grouped-query
    // attention with a quarter of the heads' K/V, untied output layer and no
    // biases. llama-tiny is a test size; llama-small the bench preset's
    // size, its SwiGLU width (8/3 x hidden, rounded up to 128) keeping the
    // MLP's FLOPs near the GELU MLP's.
    values = {{"normalization", "RMSNorm"},
              {"swiglu", "true"},
              {"position_embedding_type", "rope"},
              {"rotary_base", "10000"},
              {"group_query_attention", "true"},
              {"untie_embeddings_and_output_weights", "true"},
              {"disable_bias_linear", "true"}};
    const bool tiny = name == "llama-tiny";
    std::vector<std::pair<std::string, std::string>> shape;
    if (tiny) {
      shape = {
          {"num_layers", "4"},          {"hidden_size", "64"},
          {"num_attention_heads", "4"}, {"num_query_groups", "2"},
          {"ffn_hidden_size", "192"},   {"vocab_size", "512"},
          {"seq_length", "32"},         {"make_vocab_size_divisible_by", "1"}};
    } else {
      shape = {{"num_layers", "6"},
               {"hidden_size", "512"},
               {"num_attention_heads", "8"},
               {"num_query_groups", "2"},
               {"ffn_hidden_size", "1408"},
               {"vocab_size", "8192"},
               {"seq_length", "512"},
               {"micro_batch_size", "4"},
               {"mock_data", "true"},
               {"train_iters", "20"},
               {"log_interval", "5"},
               {"eval_iters", "0"},
               {"make_vocab_size_divisible_by", "1"}};
    }
    values.insert(values.end(), shape.begin(), shape.end());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--preset: unknown preset '", name,
                     "' (known: bench, llama-tiny, llama-small)"));
  }
  for (const auto& [flag_name, value] : values) {
    if (explicitly_set.count(flag_name)) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(flag_name);
    if (flag == nullptr && skip_undefined) continue;
    std::string error;
    if (flag == nullptr || !flag->ParseFrom(value, &error)) {
      return absl::InternalError(
          absl::StrCat("preset sets --", flag_name, ": ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace flags
}  // namespace mcc
