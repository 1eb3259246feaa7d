#ifndef CHECKPOINT_FUZZ_HF_IMPORT_FUZZ_H_
#define CHECKPOINT_FUZZ_HF_IMPORT_FUZZ_H_

// What the Hugging Face import fuzzers (hf_gpt2_import, hf_llama_import)
// share: an input is config.json and model.safetensors joined by
// mcc::fuzz::kPartSeparator, run through a config parser, ParseSafetensors
// and an import; their seeds are made by the same means.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/config.pb.h"
#include "checkpoint/file_util.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_util.h"
#include "core/testing/fuzz/fuzz_input.h"
#include "glog/logging.h"

namespace mcc::fuzz {

// The bytes of a safetensors file holding fp32 tensors of the given names and
// shapes, with deterministic values: how the import fuzzers' seeds are made.
// `stem` names the temporary file it passes through.
inline std::string RandomSafetensorsBytes(
    const std::vector<std::pair<std::string, Shape>>& shapes,
    const std::string& stem) {
  NamedTensors tensors;
  uint32_t seed = 1;
  for (const auto& [name, shape] : shapes) {
    tensors.emplace_back(
        name, testing_util::RandomTensor(shape, DType::kFloat32, seed++));
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path =
      absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", stem, ".safetensors");
  CHECK(WriteSafetensors(path, tensors).ok());
  absl::StatusOr<std::string> bytes = file_util::ReadFileToString(path);
  CHECK(bytes.ok()) << bytes.status();
  std::remove(path.c_str());
  return *std::move(bytes);
}

// One architecture's import: its config.json parser (errors must name the
// path given) and its tensor mapping.
using ParseConfigFn = absl::StatusOr<checkpoint::ModelConfig> (*)(
    absl::string_view text, const std::string& path);
using ImportFn = absl::StatusOr<std::map<std::string, Tensor>> (*)(
    const NamedTensors& hf, const checkpoint::ModelConfig& config);

// With MCC_FUZZ_WRITE_SEED=FILE set, writes config + safetensors as one
// input to FILE, after checking that it imports (a seed that does not seeds
// nothing past the readers). For LLVMFuzzerInitialize.
inline void MaybeWriteImportSeed(absl::string_view config,
                                 const std::string& safetensors,
                                 ParseConfigFn parse, ImportFn import) {
  const char* seed = std::getenv("MCC_FUZZ_WRITE_SEED");
  if (seed == nullptr) return;
  auto parsed = parse(config, "config.json");
  CHECK(parsed.ok()) << parsed.status();
  auto file = ParseSafetensors(safetensors, "model.safetensors");
  CHECK(file.ok()) << file.status();
  auto params = import(file->tensors, *parsed);
  CHECK(params.ok()) << params.status();
  std::ofstream(seed, std::ios::binary)
      << absl::StrCat(config, kPartSeparator, safetensors);
}

// One fuzz input through parse, ParseSafetensors and import: bad files must
// give errors (a config error naming config.json), never a crash; an
// accepted config has layers; `check`, when given, must accept it too.
inline void FuzzImportOnce(
    const uint8_t* data, size_t size, ParseConfigFn parse, ImportFn import,
    absl::Status (*check)(const checkpoint::ModelConfig&) = nullptr) {
  const std::vector<std::string> parts = SplitParts(data, size, 2);
  auto config = parse(parts[0], "config.json");
  if (!config.ok()) {
    CHECK(absl::string_view(config.status().message()).find("config.json") !=
          absl::string_view::npos)
        << config.status();
    return;
  }
  CHECK_GT(config->num_layers(), 0);
  if (check != nullptr) CHECK(check(*config).ok());
  auto file = ParseSafetensors(parts[1], "model.safetensors");
  if (!file.ok()) return;
  auto params = import(file->tensors, *config);
  if (params.ok()) CHECK(!params->empty());
}

}  // namespace mcc::fuzz

#endif  // CHECKPOINT_FUZZ_HF_IMPORT_FUZZ_H_
