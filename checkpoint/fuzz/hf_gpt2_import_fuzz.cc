// Fuzzes what tools/convert_checkpoint --import-hf reads: config.json and
// model.safetensors, joined by mcc::fuzz::kPartSeparator, through
// ParseGpt2ConfigJson, ParseSafetensors and ImportGpt2. Bad files must give
// an error naming the file or tensor at fault, never a crash or a runaway
// allocation.
//
// MCC_FUZZ_WRITE_SEED=FILE writes a one-layer GPT-2 that imports, as an
// input, to FILE (how the seed corpus was made).

#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/fuzz/hf_import_fuzz.h"
#include "checkpoint/hf_gpt2.h"

namespace {

constexpr char kConfig[] = R"({
  "architectures": ["GPT2LMHeadModel"],
  "model_type": "gpt2",
  "vocab_size": 6,
  "n_positions": 3,
  "n_ctx": 3,
  "n_embd": 4,
  "n_layer": 1,
  "n_head": 2,
  "n_inner": 8,
  "activation_function": "gelu_new",
  "layer_norm_epsilon": 1e-05,
  "tie_word_embeddings": true
}
)";

std::string OneLayerSafetensors() {
  return mcc::fuzz::RandomSafetensorsBytes(
      {
          {"transformer.wte.weight", {6, 4}},
          {"transformer.wpe.weight", {3, 4}},
          {"transformer.h.0.ln_1.weight", {4}},
          {"transformer.h.0.ln_1.bias", {4}},
          {"transformer.h.0.attn.c_attn.weight", {4, 12}},
          {"transformer.h.0.attn.c_attn.bias", {12}},
          {"transformer.h.0.attn.c_proj.weight", {4, 4}},
          {"transformer.h.0.attn.c_proj.bias", {4}},
          {"transformer.h.0.ln_2.weight", {4}},
          {"transformer.h.0.ln_2.bias", {4}},
          {"transformer.h.0.mlp.c_fc.weight", {4, 8}},
          {"transformer.h.0.mlp.c_fc.bias", {8}},
          {"transformer.h.0.mlp.c_proj.weight", {8, 4}},
          {"transformer.h.0.mlp.c_proj.bias", {4}},
          {"transformer.ln_f.weight", {4}},
          {"transformer.ln_f.bias", {4}},
      },
      "hf_gpt2_import_fuzz_seed");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  mcc::fuzz::MaybeWriteImportSeed(kConfig, OneLayerSafetensors(),
                                  mcc::ParseGpt2ConfigJson, mcc::ImportGpt2);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mcc::fuzz::FuzzImportOnce(data, size, mcc::ParseGpt2ConfigJson,
                            mcc::ImportGpt2);
  return 0;
}
