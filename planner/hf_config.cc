#include "planner/hf_config.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace planner {

absl::StatusOr<gpt::GPTConfig> GPTConfigFromHuggingFace(
    const std::string& json_text, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a JSON object"));
  }
  auto need = [&](const char* key) -> absl::StatusOr<int64_t> {
    if (!j.contains(key) || !j[key].is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"", key, "\" is missing or not an integer"));
    }
    return j[key].get<int64_t>();
  };
  const std::string type = j.value("model_type", "");
  gpt::GPTConfig c;
  if (type == "gpt2") {
    auto layers = need("n_layer"), hidden = need("n_embd"),
         heads = need("n_head"), positions = need("n_positions"),
         vocab = need("vocab_size");
    for (const auto* s : {&layers, &hidden, &heads, &positions, &vocab}) {
      if (!s->ok()) return s->status();
    }
    c.num_layers = static_cast<int>(*layers);
    c.hidden_size = *hidden;
    c.num_attention_heads = static_cast<int>(*heads);
    c.max_position_embeddings = *positions;
    c.vocab_size = *vocab;
    if (j.contains("n_inner") && j["n_inner"].is_number_integer()) {
      c.ffn_hidden_size = j["n_inner"].get<int64_t>();
    }
    c.untie_embeddings_and_output_weights =
        !j.value("tie_word_embeddings", true);
  } else if (type == "llama" || type == "mistral" || type == "qwen2") {
    auto layers = need("num_hidden_layers"), hidden = need("hidden_size"),
         heads = need("num_attention_heads"), ffn = need("intermediate_size"),
         positions = need("max_position_embeddings"),
         vocab = need("vocab_size");
    for (const auto* s : {&layers, &hidden, &heads, &ffn, &positions, &vocab}) {
      if (!s->ok()) return s->status();
    }
    c.num_layers = static_cast<int>(*layers);
    c.hidden_size = *hidden;
    c.num_attention_heads = static_cast<int>(*heads);
    c.num_query_groups =
        static_cast<int>(j.value("num_key_value_heads", *heads));
    c.ffn_hidden_size = *ffn;
    c.max_position_embeddings = *positions;
    c.vocab_size = *vocab;
    c.normalization = gpt::Normalization::kRMSNorm;
    c.activation = gpt::Activation::kSwiGLU;
    c.position_embedding = gpt::PositionEmbedding::kRope;
    c.add_bias_linear = type == "qwen2";
    c.untie_embeddings_and_output_weights =
        !j.value("tie_word_embeddings", false);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": model_type '", type,
        "' is not one the planner reads (gpt2, llama, mistral, qwen2)"));
  }
  c.seq_length = c.max_position_embeddings;
  return c;
}

absl::StatusOr<gpt::GPTConfig> ReadHuggingFaceConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  return GPTConfigFromHuggingFace(text.str(), path);
}

}  // namespace planner
}  // namespace mcc
