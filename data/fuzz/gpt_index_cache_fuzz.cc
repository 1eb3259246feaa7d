// Fuzzes the GPT dataset's index cache as a rank other than 0 loads it: an
// input is the three .npy files (document, sample and shuffle index) joined
// by mcc::fuzz::kPartSeparator. They are written under the cache names of a
// small dataset made at start-up, then GPTDataset::Build loads them; a cache
// it accepts must give every sample without reading outside the dataset
// (ASan) or overrunning the sample buffer.
//
// MCC_FUZZ_WRITE_SEED=FILE writes the cache that rank 0 built, as an input,
// to FILE (how the seed corpus was made).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/testing/fuzz/fuzz_input.h"
#include "data/gpt_dataset.h"
#include "data/indexed_dataset.h"
#include "data/npy.h"
#include "glog/logging.h"

namespace {

constexpr int32_t kSequenceLength = 8;
const char* const kSuffixes[3] = {"-document_index.npy", "-sample_index.npy",
                                  "-shuffle_index.npy"};

struct State {
  std::shared_ptr<const mcc::data::IndexedDataset> dataset;
  mcc::data::GPTDatasetConfig config;
  std::string cache_prefix;
};
State* state = nullptr;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), bytes.size());
  CHECK(f.good()) << "cannot write " << path;
}

mcc::data::RankSync AsRank(int rank) {
  return mcc::data::RankSync{[rank] { return rank; }, nullptr};
}

absl::StatusOr<std::unique_ptr<mcc::data::GPTDataset>> Build(int rank) {
  return mcc::data::GPTDataset::Build(
      state->dataset, 0, state->dataset->num_sequences(), 40,
      mcc::data::Split::kTrain, state->config, AsRank(rank));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                                 "/gpt_index_cache_fuzz.XXXXXX");
  CHECK(mkdtemp(dir.data()) != nullptr) << dir;
  const std::string prefix = dir + "/corpus";
  auto builder = mcc::data::IndexedDatasetBuilder::Create(
      prefix, mcc::data::TokenDType::kUInt16);
  CHECK(builder.ok()) << builder.status();
  for (int doc = 0; doc < 12; ++doc) {
    std::vector<int32_t> tokens((doc * 7) % 13);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = doc * 100 + i;
    CHECK((*builder)->AddDocument(tokens).ok());
  }
  CHECK((*builder)->Finalize().ok());
  auto dataset = mcc::data::IndexedDataset::Open(prefix);
  CHECK(dataset.ok()) << dataset.status();
  state = new State;
  state->dataset = std::move(dataset).value();
  state->config.sequence_length = kSequenceLength;
  state->config.path_to_cache = dir + "/cache";
  auto built = Build(0);
  CHECK(built.ok()) << built.status();
  state->cache_prefix = (*built)->cache_prefix();
  if (const char* seed = std::getenv("MCC_FUZZ_WRITE_SEED")) {
    std::string joined;
    for (int i = 0; i < 3; ++i) {
      if (i > 0) absl::StrAppend(&joined, mcc::fuzz::kPartSeparator);
      joined += ReadFile(state->cache_prefix + kSuffixes[i]);
    }
    WriteFile(seed, joined);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = mcc::fuzz::SplitParts(data, size, 3);
  for (int i = 0; i < 3; ++i) {
    WriteFile(state->cache_prefix + kSuffixes[i], parts[i]);
  }
  auto ds = Build(1);
  if (!ds.ok()) return 0;
  std::vector<int64_t> sample(kSequenceLength + 1);
  const int64_t n = std::min<int64_t>((*ds)->size(), 1000);
  for (int64_t i = 0; i < n; ++i) (*ds)->GetSample(i, sample.data());
  return 0;
}
