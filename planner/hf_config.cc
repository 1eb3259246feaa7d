#include "planner/hf_config.h"

#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/json_document.h"
#include "core/status_macros.h"
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
  // Every member is read by type: a wrong-typed one is an error naming the
  // file and field (nlohmann's value() would throw type_error). Sizes must
  // be positive and, where the config holds an int, fit one.
  auto need = [&](const char* key, int64_t max) -> absl::StatusOr<int64_t> {
    if (!j.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"", key, "\" is missing"));
    }
    MCC_ASSIGN_OR_RETURN(const int64_t v, JsonIntMember(j, key, 0, path));
    if (v < 1 || v > max) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": \"", key, "\" is ", v, ", not in [1, ", max, "]"));
    }
    return v;
  };
  constexpr int64_t kInt = std::numeric_limits<int>::max();
  constexpr int64_t kSize = std::numeric_limits<int64_t>::max();
  MCC_ASSIGN_OR_RETURN(const std::string type,
                       JsonStringMember(j, "model_type", "", path));
  gpt::GPTConfig c;
  if (type == "gpt2") {
    MCC_ASSIGN_OR_RETURN(c.num_layers, need("n_layer", kInt));
    MCC_ASSIGN_OR_RETURN(c.hidden_size, need("n_embd", kSize));
    MCC_ASSIGN_OR_RETURN(c.num_attention_heads, need("n_head", kInt));
    MCC_ASSIGN_OR_RETURN(c.max_position_embeddings, need("n_positions", kSize));
    MCC_ASSIGN_OR_RETURN(c.vocab_size, need("vocab_size", kSize));
    // n_inner: null (the usual) or absent means 4 x hidden.
    if (j.contains("n_inner") && !j["n_inner"].is_null()) {
      MCC_ASSIGN_OR_RETURN(c.ffn_hidden_size, need("n_inner", kSize));
    }
    MCC_ASSIGN_OR_RETURN(const bool tied,
                         JsonBoolMember(j, "tie_word_embeddings", true, path));
    c.untie_embeddings_and_output_weights = !tied;
  } else if (type == "llama" || type == "mistral" || type == "qwen2") {
    MCC_ASSIGN_OR_RETURN(c.num_layers, need("num_hidden_layers", kInt));
    MCC_ASSIGN_OR_RETURN(c.hidden_size, need("hidden_size", kSize));
    MCC_ASSIGN_OR_RETURN(c.num_attention_heads,
                         need("num_attention_heads", kInt));
    c.num_query_groups = c.num_attention_heads;
    if (j.contains("num_key_value_heads")) {
      MCC_ASSIGN_OR_RETURN(c.num_query_groups,
                           need("num_key_value_heads", kInt));
    }
    MCC_ASSIGN_OR_RETURN(c.ffn_hidden_size, need("intermediate_size", kSize));
    MCC_ASSIGN_OR_RETURN(c.max_position_embeddings,
                         need("max_position_embeddings", kSize));
    MCC_ASSIGN_OR_RETURN(c.vocab_size, need("vocab_size", kSize));
    c.normalization = gpt::Normalization::kRMSNorm;
    c.activation = gpt::Activation::kSwiGLU;
    c.position_embedding = gpt::PositionEmbedding::kRope;
    c.add_bias_linear = type == "qwen2";
    MCC_ASSIGN_OR_RETURN(const bool tied,
                         JsonBoolMember(j, "tie_word_embeddings", false, path));
    c.untie_embeddings_and_output_weights = !tied;
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
