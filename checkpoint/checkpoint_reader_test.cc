// CheckpointReader on hostile metadata.pb: extents, shard boxes and byte
// ranges that would overflow int64 arithmetic are errors naming the tensor.

#include "checkpoint/checkpoint_reader.h"

#include <limits>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/file_util.h"
#include "checkpoint/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using testing_util::FreshDir;
using testing_util::RandomTensor;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

class HostileMetadata : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir("hostile");
    ASSERT_TRUE(
        SaveCheckpoint(dir_, 1,
                       {ShardedTensorRef::Replicated(
                           "w", RandomTensor({4, 2}, DType::kFloat32, 1))},
                       {}, {}, DistContext::Single())
            .ok());
    meta_path_ = dir_ + "/iter_0000001/metadata.pb";
    auto bytes = file_util::ReadFileToString(meta_path_);
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(meta_.ParseFromString(*bytes));
    ASSERT_EQ(meta_.tensors_size(), 1);
  }
  checkpoint::TensorRecord* W() { return meta_.mutable_tensors(0); }
  checkpoint::ShardRecord* Shard() { return W()->mutable_shards(0); }
  // Writes the edited metadata and expects Open to refuse it.
  void ExpectRefused(const std::string& what) {
    ASSERT_TRUE(
        file_util::WriteFileAtomically(meta_path_, meta_.SerializeAsString())
            .ok());
    auto r = CheckpointReader::Open(dir_);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
    EXPECT_NE(r.status().message().find("tensor w"), std::string::npos)
        << r.status();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status();
  }
  std::string dir_, meta_path_;
  checkpoint::CheckpointMetadata meta_;
};

TEST_F(HostileMetadata, UntouchedLoads) {
  EXPECT_TRUE(CheckpointReader::Open(dir_).ok());
}

// What the files hold bounds what a reader may allocate for the model.
TEST_F(HostileMetadata, ShardFileBytesCountsEachFileOnce) {
  auto reader = CheckpointReader::Open(dir_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto bytes = (*reader)->ShardFileBytes();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  // The one 4 x 2 fp32 tensor's shard file: its 32 bytes at least.
  EXPECT_GE(*bytes, 32);
  const std::string file = dir_ + "/iter_0000001/" + Shard()->file();
  auto size = file_util::ReadFileToString(file);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*bytes, static_cast<int64_t>(size->size()));
}

TEST_F(HostileMetadata, NegativeGlobalExtent) {
  W()->set_global_shape(0, -4);
  ExpectRefused("negative extent");
}

TEST_F(HostileMetadata, GlobalShapeBeyondInt64Bytes) {
  W()->set_global_shape(0, kMax / 2);
  W()->set_global_shape(1, 3);
  ExpectRefused("more bytes than int64");
}

TEST_F(HostileMetadata, ShardOffsetThatOverflows) {
  Shard()->set_global_offsets(0, kMax);
  ExpectRefused("outside it");
}

TEST_F(HostileMetadata, NegativeShardExtent) {
  Shard()->set_local_shape(1, -2);
  ExpectRefused("outside it");
}

TEST_F(HostileMetadata, ByteRangePastInt64) {
  Shard()->set_byte_offset(static_cast<uint64_t>(kMax) - 8);
  ExpectRefused("at byte");
}

// Sizes that int64 counts but the shard files do not hold: refused before
// anything is allocated for them (a 2^40-element tensor claimed by a
// 32-byte shard file made ReadTensor allocate 4 TiB).
TEST_F(HostileMetadata, GlobalShapeLargerThanTheShardFiles) {
  W()->set_global_shape(0, int64_t{1} << 38);
  W()->set_global_shape(1, 4);
  Shard()->set_local_shape(0, int64_t{1} << 38);
  Shard()->set_local_shape(1, 4);
  Shard()->set_byte_length(uint64_t{1} << 42);
  ASSERT_TRUE(
      file_util::WriteFileAtomically(meta_path_, meta_.SerializeAsString())
          .ok());
  auto r = CheckpointReader::Open(dir_);
  ASSERT_TRUE(r.ok()) << r.status();  // Open reads no shard file.
  auto t = (*r)->ReadTensor("w");
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(absl::IsDataLoss(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("tensor w"), std::string::npos)
      << t.status();
  EXPECT_NE(t.status().message().find("shard_r00000.bin"), std::string::npos)
      << t.status();
  // A region of it (the model's own buffer): the shard is refused before its
  // bytes are read into memory.
  Tensor out = Tensor::Zeros({2, 4}, DType::kFloat32);
  const absl::Status s = (*r)->ReadRegion("w", {0, 0}, &out);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s;
}

// Every shard inside its file, but the files cannot hold the whole tensor.
TEST_F(HostileMetadata, ShardFilesSmallerThanTheTensor) {
  W()->set_global_shape(0, int64_t{1} << 36);
  ASSERT_TRUE(
      file_util::WriteFileAtomically(meta_path_, meta_.SerializeAsString())
          .ok());
  auto r = CheckpointReader::Open(dir_);
  ASSERT_TRUE(r.ok()) << r.status();
  auto t = (*r)->ReadTensor("w");
  EXPECT_TRUE(absl::IsDataLoss(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("needs 549755813888 bytes but its "
                                      "shard files (shard_r00000.bin) hold"),
            std::string::npos)
      << t.status();
}

// A shard past the end of its file, within the tensor's size.
TEST_F(HostileMetadata, ShardPastTheEndOfItsFile) {
  Shard()->set_byte_offset(4096);
  ASSERT_TRUE(
      file_util::WriteFileAtomically(meta_path_, meta_.SerializeAsString())
          .ok());
  auto r = CheckpointReader::Open(dir_);
  ASSERT_TRUE(r.ok()) << r.status();
  auto t = (*r)->ReadTensor("w");
  EXPECT_TRUE(absl::IsDataLoss(t.status())) << t.status();
  EXPECT_NE(t.status().message().find("truncated"), std::string::npos)
      << t.status();
}

}  // namespace
}  // namespace mcc
