// Fuzzes what tools/convert_checkpoint --import-hf reads for a
// LlamaForCausalLM: config.json and model.safetensors, joined by
// mcc::fuzz::kPartSeparator, through ParseLlamaConfigJson, ParseSafetensors
// and ImportLlama. Bad files must give an error naming the file or tensor at
// fault, never a crash or a runaway allocation.
//
// MCC_FUZZ_WRITE_SEED=FILE writes a one-layer Llama with grouped-query
// attention and an untied output layer that imports, as an input, to FILE
// (how the seed corpus was made); with MCC_FUZZ_SEED_MODEL=mixtral a
// one-layer Mixtral (2 experts, top-1), with qwen2_moe a two-layer
// Qwen2-MoE (layer 0 dense through mlp_only_layers, layer 1 with 2 experts,
// a gated shared expert and q/k/v biases), so the MoE branches are seeded.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/fuzz/hf_import_fuzz.h"
#include "checkpoint/hf_llama.h"

namespace {

// hidden 4, 2 query heads of 2 dimensions sharing one K/V head, ffn 8.
constexpr char kConfig[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "model_type": "llama",
  "vocab_size": 6,
  "hidden_size": 4,
  "intermediate_size": 8,
  "num_hidden_layers": 1,
  "num_attention_heads": 2,
  "num_key_value_heads": 1,
  "max_position_embeddings": 3,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "hidden_act": "silu",
  "tie_word_embeddings": false
}
)";

std::string OneLayerSafetensors() {
  return mcc::fuzz::RandomSafetensorsBytes(
      {
          {"model.embed_tokens.weight", {6, 4}},
          {"model.layers.0.input_layernorm.weight", {4}},
          {"model.layers.0.self_attn.q_proj.weight", {4, 4}},
          {"model.layers.0.self_attn.k_proj.weight", {2, 4}},
          {"model.layers.0.self_attn.v_proj.weight", {2, 4}},
          {"model.layers.0.self_attn.o_proj.weight", {4, 4}},
          {"model.layers.0.post_attention_layernorm.weight", {4}},
          {"model.layers.0.mlp.gate_proj.weight", {8, 4}},
          {"model.layers.0.mlp.up_proj.weight", {8, 4}},
          {"model.layers.0.mlp.down_proj.weight", {4, 8}},
          {"model.norm.weight", {4}},
          {"lm_head.weight", {6, 4}},
      },
      "hf_llama_import_fuzz_seed");
}

// Mixtral: hidden 4, 2 heads sharing one K/V head, 2 experts of ffn 6,
// top-1.
constexpr char kMixtralConfig[] = R"({
  "architectures": ["MixtralForCausalLM"],
  "model_type": "mixtral",
  "vocab_size": 6,
  "hidden_size": 4,
  "intermediate_size": 6,
  "num_hidden_layers": 1,
  "num_attention_heads": 2,
  "num_key_value_heads": 1,
  "max_position_embeddings": 3,
  "rms_norm_eps": 1e-05,
  "rope_theta": 1000000.0,
  "hidden_act": "silu",
  "num_local_experts": 2,
  "num_experts_per_tok": 1,
  "sliding_window": null,
  "tie_word_embeddings": false
}
)";

std::string MixtralSafetensors() {
  const std::string b = "model.layers.0.";
  const std::string m = b + "block_sparse_moe.";
  return mcc::fuzz::RandomSafetensorsBytes(
      {
          {"model.embed_tokens.weight", {6, 4}},
          {b + "input_layernorm.weight", {4}},
          {b + "self_attn.q_proj.weight", {4, 4}},
          {b + "self_attn.k_proj.weight", {2, 4}},
          {b + "self_attn.v_proj.weight", {2, 4}},
          {b + "self_attn.o_proj.weight", {4, 4}},
          {b + "post_attention_layernorm.weight", {4}},
          {m + "gate.weight", {2, 4}},
          {m + "experts.0.w1.weight", {6, 4}},
          {m + "experts.0.w3.weight", {6, 4}},
          {m + "experts.0.w2.weight", {4, 6}},
          {m + "experts.1.w1.weight", {6, 4}},
          {m + "experts.1.w3.weight", {6, 4}},
          {m + "experts.1.w2.weight", {4, 6}},
          {"model.norm.weight", {4}},
          {"lm_head.weight", {6, 4}},
      },
      "hf_mixtral_import_fuzz_seed");
}

// Qwen2-MoE: two layers, the first dense (ffn 8), the second 2 experts of
// ffn 2, top-2 not renormalised, a shared expert of ffn 4 behind its gate.
constexpr char kQwen2MoeConfig[] = R"({
  "architectures": ["Qwen2MoeForCausalLM"],
  "model_type": "qwen2_moe",
  "vocab_size": 6,
  "hidden_size": 4,
  "intermediate_size": 8,
  "moe_intermediate_size": 2,
  "shared_expert_intermediate_size": 4,
  "num_hidden_layers": 2,
  "num_attention_heads": 2,
  "num_key_value_heads": 1,
  "max_position_embeddings": 3,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "hidden_act": "silu",
  "num_experts": 2,
  "num_experts_per_tok": 2,
  "norm_topk_prob": false,
  "decoder_sparse_step": 1,
  "mlp_only_layers": [0],
  "use_sliding_window": false,
  "tie_word_embeddings": false
}
)";

std::string Qwen2MoeSafetensors() {
  std::vector<std::pair<std::string, mcc::Shape>> shapes = {
      {"model.embed_tokens.weight", {6, 4}}};
  for (int layer = 0; layer < 2; ++layer) {
    const std::string b = "model.layers." + std::to_string(layer) + ".";
    const std::vector<std::pair<std::string, mcc::Shape>> attention = {
        {b + "input_layernorm.weight", {4}},
        {b + "self_attn.q_proj.weight", {4, 4}},
        {b + "self_attn.q_proj.bias", {4}},
        {b + "self_attn.k_proj.weight", {2, 4}},
        {b + "self_attn.k_proj.bias", {2}},
        {b + "self_attn.v_proj.weight", {2, 4}},
        {b + "self_attn.v_proj.bias", {2}},
        {b + "self_attn.o_proj.weight", {4, 4}},
        {b + "post_attention_layernorm.weight", {4}},
    };
    shapes.insert(shapes.end(), attention.begin(), attention.end());
    const std::string m = b + "mlp.";
    if (layer == 0) {
      shapes.push_back({m + "gate_proj.weight", {8, 4}});
      shapes.push_back({m + "up_proj.weight", {8, 4}});
      shapes.push_back({m + "down_proj.weight", {4, 8}});
      continue;
    }
    shapes.push_back({m + "gate.weight", {2, 4}});
    for (int e = 0; e < 2; ++e) {
      const std::string x = m + "experts." + std::to_string(e) + ".";
      shapes.push_back({x + "gate_proj.weight", {2, 4}});
      shapes.push_back({x + "up_proj.weight", {2, 4}});
      shapes.push_back({x + "down_proj.weight", {4, 2}});
    }
    shapes.push_back({m + "shared_expert.gate_proj.weight", {4, 4}});
    shapes.push_back({m + "shared_expert.up_proj.weight", {4, 4}});
    shapes.push_back({m + "shared_expert.down_proj.weight", {4, 4}});
    shapes.push_back({m + "shared_expert_gate.weight", {1, 4}});
  }
  shapes.push_back({"model.norm.weight", {4}});
  shapes.push_back({"lm_head.weight", {6, 4}});
  return mcc::fuzz::RandomSafetensorsBytes(shapes,
                                           "hf_qwen2_moe_import_fuzz_seed");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (std::getenv("MCC_FUZZ_WRITE_SEED") == nullptr) return 0;
  const char* model = std::getenv("MCC_FUZZ_SEED_MODEL");
  const std::string which = model != nullptr ? model : "llama";
  if (which == "mixtral") {
    mcc::fuzz::MaybeWriteImportSeed(kMixtralConfig, MixtralSafetensors(),
                                    mcc::ParseLlamaConfigJson,
                                    mcc::ImportLlama);
  } else if (which == "qwen2_moe") {
    mcc::fuzz::MaybeWriteImportSeed(kQwen2MoeConfig, Qwen2MoeSafetensors(),
                                    mcc::ParseLlamaConfigJson,
                                    mcc::ImportLlama);
  } else {
    CHECK(which == "llama") << "MCC_FUZZ_SEED_MODEL " << which
                            << " is not llama, mixtral or qwen2_moe";
    mcc::fuzz::MaybeWriteImportSeed(kConfig, OneLayerSafetensors(),
                                    mcc::ParseLlamaConfigJson,
                                    mcc::ImportLlama);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mcc::fuzz::FuzzImportOnce(data, size, mcc::ParseLlamaConfigJson,
                            mcc::ImportLlama, mcc::CheckLlamaCompatible);
  return 0;
}
