#ifndef CHECKPOINT_FUZZ_RANDOM_SAFETENSORS_H_
#define CHECKPOINT_FUZZ_RANDOM_SAFETENSORS_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_util.h"
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
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::remove(path.c_str());
  return ss.str();
}

}  // namespace mcc::fuzz

#endif  // CHECKPOINT_FUZZ_RANDOM_SAFETENSORS_H_
