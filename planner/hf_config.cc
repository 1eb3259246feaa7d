#include "planner/hf_config.h"

#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/json_document.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace planner {

namespace {

bool IsMoeType(const std::string& type) {
  return type == "mixtral" || type == "qwen2_moe" || type == "qwen3_moe";
}

// The mixture of experts of Mixtral (every layer: num_local_experts of
// intermediate_size), Qwen2-MoE and Qwen3-MoE (num_experts of
// moe_intermediate_size on every decoder_sparse_step-th layer not in
// mlp_only_layers, the dense ones of intermediate_size; Qwen2-MoE's shared
// expert of shared_expert_intermediate_size and query/key/value biases).
// Qwen2-MoE's shared-expert gate (h weights a layer) is not counted.
absl::Status ReadMoe(const nlohmann::json& j, const std::string& type,
                     const std::string& path, gpt::GPTConfig* c) {
  auto need = [&](const char* key) -> absl::StatusOr<int64_t> {
    if (!j.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"", key, "\" is missing (", type, ")"));
    }
    MCC_ASSIGN_OR_RETURN(const int64_t v, JsonIntMember(j, key, 0, path));
    if (v < 1 || v > std::numeric_limits<int>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"", key, "\" is ", v, ", not positive"));
    }
    return v;
  };
  MCC_ASSIGN_OR_RETURN(const int64_t topk, need("num_experts_per_tok"));
  c->moe_router_topk = static_cast<int>(topk);
  if (type == "mixtral") {
    MCC_ASSIGN_OR_RETURN(const int64_t e, need("num_local_experts"));
    c->num_experts = static_cast<int>(e);
    c->moe_layer_freq = "1";
    return absl::OkStatus();
  }
  MCC_ASSIGN_OR_RETURN(const int64_t e, need("num_experts"));
  c->num_experts = static_cast<int>(e);
  MCC_ASSIGN_OR_RETURN(c->moe_ffn_hidden_size, need("moe_intermediate_size"));
  if (type == "qwen2_moe") {
    c->add_bias_linear = false;
    c->add_qkv_bias = true;
    if (j.contains("shared_expert_intermediate_size")) {
      MCC_ASSIGN_OR_RETURN(
          const int64_t fs,
          JsonIntMember(j, "shared_expert_intermediate_size", 0, path));
      c->moe_shared_expert_intermediate_size = fs;
    }
  } else if (j.contains("head_dim")) {
    MCC_ASSIGN_OR_RETURN(const int64_t d,
                         JsonIntMember(j, "head_dim", 0, path));
    if (d != c->head_dim()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": \"head_dim\" ", d, " is not hidden_size / heads ",
          c->head_dim(), "; the planner's attention has no other"));
    }
  }
  // The layer pattern is written out layer by layer.
  constexpr int kMostMoeLayers = 1 << 16;
  if (c->num_layers > kMostMoeLayers) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": \"num_hidden_layers\" ", c->num_layers, " is more than the ",
        kMostMoeLayers, " layers a mixture of experts is planned for"));
  }
  int64_t step = 1;
  if (j.contains("decoder_sparse_step")) {
    MCC_ASSIGN_OR_RETURN(step, need("decoder_sparse_step"));
  }
  std::vector<bool> moe(c->num_layers);
  for (int i = 0; i < c->num_layers; ++i) moe[i] = (i + 1) % step == 0;
  MCC_ASSIGN_OR_RETURN(const std::vector<int64_t> dense,
                       JsonIntArrayMember(j, "mlp_only_layers", path));
  for (int64_t layer : dense) {
    if (layer < 0 || layer >= c->num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"mlp_only_layers\" holds ", layer,
                       ", not a layer of ", c->num_layers));
    }
    moe[layer] = false;
  }
  std::string pattern = "[";
  for (int i = 0; i < c->num_layers; ++i) {
    absl::StrAppend(&pattern, i > 0 ? "," : "", moe[i] ? 1 : 0);
  }
  c->moe_layer_freq = pattern + "]";
  return absl::OkStatus();
}

}  // namespace

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
  } else if (type == "llama" || type == "mistral" || type == "qwen2" ||
             IsMoeType(type)) {
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
    if (IsMoeType(type)) {
      MCC_RETURN_IF_ERROR(ReadMoe(j, type, path, &c));
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": model_type '", type,
        "' is not one the planner reads (gpt2, llama, mistral, qwen2, "
        "mixtral, qwen2_moe, qwen3_moe)"));
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
