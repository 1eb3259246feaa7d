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
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/fuzz/random_safetensors.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/safetensors.h"
#include "glog/logging.h"
#include "tools/fuzz/fuzz_input.h"

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

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  if (const char* seed = std::getenv("MCC_FUZZ_WRITE_SEED")) {
    const std::string input =
        absl::StrCat(kConfig, mcc::fuzz::kPartSeparator, OneLayerSafetensors());
    // The seed must import, or it seeds nothing past the readers.
    auto config = mcc::ParseLlamaConfigJson(kConfig, "config.json");
    CHECK(config.ok()) << config.status();
    auto file = mcc::ParseSafetensors(
        mcc::fuzz::SplitParts(reinterpret_cast<const uint8_t*>(input.data()),
                              input.size(), 2)[1],
        "model.safetensors");
    CHECK(file.ok()) << file.status();
    auto params = mcc::ImportLlama(file->tensors, *config);
    CHECK(params.ok()) << params.status();
    std::ofstream(seed, std::ios::binary) << input;
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = mcc::fuzz::SplitParts(data, size, 2);
  auto config = mcc::ParseLlamaConfigJson(parts[0], "config.json");
  if (!config.ok()) {
    CHECK(absl::string_view(config.status().message()).find("config.json") !=
          absl::string_view::npos)
        << config.status();
    return 0;
  }
  CHECK_GT(config->num_layers(), 0);
  // An accepted configuration is one the GPT model can build.
  CHECK(mcc::CheckLlamaCompatible(*config).ok());
  auto file = mcc::ParseSafetensors(parts[1], "model.safetensors");
  if (!file.ok()) return 0;
  auto params = mcc::ImportLlama(file->tensors, *config);
  if (params.ok()) CHECK(!params->empty());
  return 0;
}
