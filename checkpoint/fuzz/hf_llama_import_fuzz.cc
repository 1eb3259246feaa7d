// Fuzzes what tools/convert_checkpoint --import-hf reads for a
// LlamaForCausalLM: config.json and model.safetensors, joined by
// mcc::fuzz::kPartSeparator, through ParseLlamaConfigJson, ParseSafetensors
// and ImportLlama. Bad files must give an error naming the file or tensor at
// fault, never a crash or a runaway allocation.
//
// MCC_FUZZ_WRITE_SEED=FILE writes a one-layer Llama with grouped-query
// attention and an untied output layer that imports, as an input, to FILE
// (how the seed corpus was made).

#include <cstddef>
#include <cstdint>
#include <string>

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

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  mcc::fuzz::MaybeWriteImportSeed(kConfig, OneLayerSafetensors(),
                                  mcc::ParseLlamaConfigJson, mcc::ImportLlama);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mcc::fuzz::FuzzImportOnce(data, size, mcc::ParseLlamaConfigJson,
                            mcc::ImportLlama, mcc::CheckLlamaCompatible);
  return 0;
}
