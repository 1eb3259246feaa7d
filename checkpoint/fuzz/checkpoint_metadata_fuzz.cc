// Fuzzes a checkpoint as CheckpointReader finds it on disk: an input is
// metadata.pb, the shard file shard_r00000.bin and the tracker
// latest_checkpointed_iteration.txt, joined by mcc::fuzz::kPartSeparator,
// written into DIR (the first two into DIR/iter_0000100) for each run.
// Damaged metadata or shards must give an error; a checkpoint the reader
// opens must read every tensor it lists, or refuse it, without reading
// outside a shard or its output (ASan) and without allocating more than the
// shard file holds; it must report a stored configuration. The tracker goes
// through FindCheckpointToLoad and Open(DIR): a location it returns holds
// metadata.pb, and its errors name the directory.
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
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/dist_context.h"
#include "checkpoint/file_util.h"
#include "checkpoint/test_util.h"
#include "core/testing/fuzz/fuzz_input.h"
#include "glog/logging.h"

namespace {

constexpr int64_t kIteration = 100;

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
std::string ShardPath() { return IterDir() + "/" + mcc::ShardFileName(0); }
std::string TrackerPath() { return *dir + "/" + mcc::kLatestFileName; }

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
    WriteFile(seed,
              absl::StrCat(ReadFile(IterDir() + "/metadata.pb"),
                           mcc::fuzz::kPartSeparator, ReadFile(ShardPath()),
                           mcc::fuzz::kPartSeparator, ReadFile(TrackerPath())));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts = mcc::fuzz::SplitParts(data, size, 3);
  WriteFile(IterDir() + "/metadata.pb", parts[0]);
  WriteFile(ShardPath(), parts[1]);
  WriteFile(TrackerPath(), parts[2]);

  // The tracker: an error naming the directory, or a complete checkpoint.
  auto found = mcc::FindCheckpointToLoad(*dir);
  if (found.ok()) {
    CHECK(found->has_value()) << "iter_0000100 exists: never a fresh start";
    CHECK(mcc::file_util::Exists((*found)->path + "/metadata.pb"))
        << (*found)->path;
    CHECK_EQ((*found)->iteration, kIteration);
  } else {
    CHECK(found.status().message().find(*dir) != std::string::npos)
        << found.status();
  }
  auto by_tracker = mcc::CheckpointReader::Open(*dir);
  CHECK(by_tracker.ok() || !by_tracker.status().message().empty());

  auto reader = mcc::CheckpointReader::Open(*dir, kIteration);
  if (!reader.ok()) {
    CHECK(!reader.status().message().empty());
    return 0;
  }
  mcc::CheckpointReader& r = **reader;
  r.RankStateOf(0).IgnoreError();
  r.CheckModelConfig(r.common_state().model()).IgnoreError();
  // eval and serve bound the stored model config by this before building it.
  auto shard_bytes = r.ShardFileBytes();
  if (shard_bytes.ok()) CHECK_GE(*shard_bytes, 0);
  int read = 0;
  for (const std::string& name : r.TensorNames()) {
    if (++read > 16) break;
    auto t = r.FindTensor(name);
    CHECK(t.ok()) << t.status();
    for (int64_t d : (*t)->global_shape()) {
      CHECK_GE(d, 0) << name;  // Open rejects negative extents.
    }
    // Any size: the reader refuses what the shard file cannot hold before
    // allocating it.
    auto tensor = r.ReadTensor(name);
    if (!tensor.ok()) continue;
    CHECK_LE(tensor->nbytes(), parts[1].size()) << name;
    int64_t n = 1;
    for (int64_t d : (*t)->global_shape()) n *= d;
    CHECK_EQ(tensor->numel(), n) << name;
  }
  return 0;
}
