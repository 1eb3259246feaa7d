// Fuzzes a checkpoint as CheckpointReader finds it on disk: an input is
// metadata.pb and the shard file shard_r000000.bin, joined by
// mcc::fuzz::kPartSeparator, written into DIR/iter_0000100 for each run.
// Damaged metadata or shards must give an error; a checkpoint the reader
// opens must read every (reasonably sized) tensor without reading outside a
// shard or its output (ASan) and report a stored configuration.
//
// MCC_FUZZ_WRITE_SEED=FILE writes the checkpoint that start-up saved, as an
// input, to FILE (how the seed corpus was made).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/dist_context.h"
#include "checkpoint/file_util.h"
#include "checkpoint/test_util.h"
#include "glog/logging.h"
#include "tools/fuzz/fuzz_input.h"

namespace {

constexpr int64_t kIteration = 100;
// Tensors larger than this are not read whole (an honest reader may refuse
// them for memory, which is no bug).
constexpr int64_t kMaxElements = 1 << 16;

std::string* dir = nullptr;

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

std::string IterDir() { return *dir + "/iter_0000100"; }

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string d = absl::StrCat(tmp != nullptr ? tmp : "/tmp",
                               "/checkpoint_metadata_fuzz.XXXXXX");
  CHECK(mkdtemp(d.data()) != nullptr) << d;
  dir = new std::string(d);
  using mcc::testing_util::RandomTensor;
  std::vector<mcc::ShardedTensorRef> refs = {
      mcc::ShardedTensorRef::Replicated(
          "w", RandomTensor({6, 4}, mcc::DType::kFloat32, 1)),
      mcc::ShardedTensorRef::Replicated(
          "b", RandomTensor({4}, mcc::DType::kBFloat16, 2)),
      mcc::ShardedTensorRef::Replicated(
          "steps", RandomTensor({3}, mcc::DType::kInt64, 3))};
  mcc::checkpoint::CommonState common;
  common.mutable_model()->set_num_layers(2);
  common.mutable_model()->set_hidden_size(4);
  common.mutable_model()->set_padded_vocab_size(6);
  mcc::checkpoint::RankState rank_state;
  (*rank_state.mutable_rng_states())["cpu"] = "rng";
  CHECK(mcc::SaveCheckpoint(*dir, kIteration, refs, common, rank_state,
                            mcc::DistContext::Single())
            .ok());
  if (const char* seed = std::getenv("MCC_FUZZ_WRITE_SEED")) {
    WriteFile(seed, absl::StrCat(ReadFile(IterDir() + "/metadata.pb"),
                                 mcc::fuzz::kPartSeparator,
                                 ReadFile(IterDir() + "/shard_r000000.bin")));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = mcc::fuzz::SplitParts(data, size, 2);
  WriteFile(IterDir() + "/metadata.pb", parts[0]);
  WriteFile(IterDir() + "/shard_r000000.bin", parts[1]);
  auto reader = mcc::CheckpointReader::Open(*dir, kIteration);
  if (!reader.ok()) {
    CHECK(!reader.status().message().empty());
    return 0;
  }
  mcc::CheckpointReader& r = **reader;
  r.RankStateOf(0).IgnoreError();
  r.CheckModelConfig(r.common_state().model()).IgnoreError();
  int read = 0;
  for (const std::string& name : r.TensorNames()) {
    if (++read > 16) break;
    auto t = r.FindTensor(name);
    CHECK(t.ok()) << t.status();
    int64_t n = 1;
    for (int64_t d : (*t)->global_shape()) {
      CHECK_GE(d, 0) << name;  // Open rejects negative extents.
      n = d == 0 ? 0 : (n > kMaxElements / d ? kMaxElements + 1 : n * d);
    }
    if (n > kMaxElements) continue;
    auto tensor = r.ReadTensor(name);
    if (tensor.ok()) CHECK_EQ(tensor->numel(), n) << name;
  }
  return 0;
}
