#include "data/indexed_dataset.h"

#include <cstring>

#include "data/test_util.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

using testing::ReadAll;
using testing::TempDir;
using testing::WriteAll;

// The bytes Megatron-LM's IndexedDatasetBuilder writes for documents
// {[1,2,3]}, {[], [4]} with uint16 tokens, assembled field by field from the
// format's description (independently of the writer under test).
std::string ExpectedIdx() {
  std::string s("MMIDIDX\0\0", 9);
  auto u64 = [&](uint64_t v) { s.append(reinterpret_cast<char*>(&v), 8); };
  auto i32 = [&](int32_t v) { s.append(reinterpret_cast<char*>(&v), 4); };
  u64(1);                  // version
  s.push_back(8);          // dtype code: uint16
  u64(3);                  // sequences
  u64(3);                  // document index entries
  i32(3), i32(0), i32(1);  // lengths
  u64(0), u64(6), u64(6);  // byte pointers
  u64(0), u64(1), u64(3);  // document indices
  return s;
}

TEST(IndexedDataset, WritesMegatronBytesAndReadsThemBack) {
  const std::string prefix = TempDir("idx_rt") + "/d";
  auto b = IndexedDatasetBuilder::Create(prefix, TokenDType::kUInt16);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE((*b)->AddDocument(std::vector<int32_t>{1, 2, 3}).ok());
  ASSERT_TRUE((*b)->AddSequence(std::vector<int32_t>{}).ok());
  ASSERT_TRUE((*b)->AddSequence(std::vector<int32_t>{4}).ok());
  (*b)->EndDocument();
  ASSERT_TRUE((*b)->Finalize().ok());
  EXPECT_EQ(ReadAll(IdxPath(prefix)), ExpectedIdx());
  EXPECT_EQ(ReadAll(BinPath(prefix)), std::string("\1\0\2\0\3\0\4\0", 8));

  auto ds = IndexedDataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_sequences(), 3);
  EXPECT_EQ((*ds)->num_documents(), 2);
  EXPECT_EQ((*ds)->num_tokens(), 4);
  EXPECT_EQ((*ds)->Get(0), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE((*ds)->Get(1).empty());
  EXPECT_EQ((*ds)->Get(2), (std::vector<int64_t>{4}));
  int64_t two[2];
  (*ds)->Read(0, 1, 2, two);
  EXPECT_EQ(two[0], 2);
  EXPECT_EQ(two[1], 3);
}

TEST(IndexedDataset, EveryDTypeRoundTrips) {
  for (int code = 1; code <= 8; ++code) {
    const TokenDType dt = static_cast<TokenDType>(code);
    const std::string prefix = TempDir("idx_dt" + std::to_string(code)) + "/d";
    std::vector<int64_t> tokens = {0, 1, 100, 127};
    if (dt != TokenDType::kInt8) tokens.push_back(200);
    if (TokenDTypeSize(dt) >= 2) tokens.push_back(30000);
    if (dt != TokenDType::kUInt8 && dt != TokenDType::kUInt16) {
      tokens.push_back(-5);
    }
    auto b = IndexedDatasetBuilder::Create(prefix, dt);
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE((*b)->AddSequence(tokens).ok());
    (*b)->EndDocument();
    ASSERT_TRUE((*b)->Finalize().ok());
    auto ds = IndexedDataset::Open(prefix);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ((*ds)->dtype(), dt);
    EXPECT_EQ((*ds)->Get(0), tokens) << TokenDTypeName(dt);
  }
}

TEST(IndexedDataset, TokenOutOfRangeIsAnError) {
  const std::string dir = TempDir("idx_range");
  auto b = IndexedDatasetBuilder::Create(dir + "/d", TokenDType::kUInt16);
  ASSERT_TRUE(b.ok());
  absl::Status s = (*b)->AddSequence(std::vector<int64_t>{1, 70000});
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(s.message().find("70000"), std::string::npos) << s;
}

TEST(IndexedDataset, AbandonedWriteLeavesNoFinalFiles) {
  const std::string prefix = TempDir("idx_abandon") + "/d";
  {
    auto b = IndexedDatasetBuilder::Create(prefix, TokenDType::kUInt16);
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE((*b)->AddDocument(std::vector<int32_t>{1, 2}).ok());
  }
  EXPECT_EQ(ReadAll(BinPath(prefix)), "");
  auto ds = IndexedDataset::Open(prefix);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::system(("test -z \"$(ls " +
                         prefix.substr(0, prefix.size() - 2) + ")\"")
                            .c_str()),
            0)
      << "temporary files left behind";
}

class BadIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = TempDir("idx_bad") + "/d";
    auto b = IndexedDatasetBuilder::Create(prefix_, TokenDType::kUInt16);
    ASSERT_TRUE(b.ok());
    ASSERT_TRUE((*b)->AddDocument(std::vector<int32_t>{1, 2, 3}).ok());
    ASSERT_TRUE((*b)->AddDocument(std::vector<int32_t>{4, 5}).ok());
    ASSERT_TRUE((*b)->Finalize().ok());
    idx_ = ReadAll(IdxPath(prefix_));
    bin_ = ReadAll(BinPath(prefix_));
  }
  absl::Status Open() { return IndexedDataset::Open(prefix_).status(); }
  void Expect(absl::Status s, const std::string& a, const std::string& b) {
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(a), std::string::npos) << s;
    EXPECT_NE(s.message().find(b), std::string::npos) << s;
  }
  std::string prefix_, idx_, bin_;
};

TEST_F(BadIndex, WrongMagic) {
  idx_[0] = 'X';
  WriteAll(IdxPath(prefix_), idx_);
  Expect(Open(), IdxPath(prefix_), "wrong magic");
}

TEST_F(BadIndex, WrongVersion) {
  idx_[9] = 2;
  WriteAll(IdxPath(prefix_), idx_);
  Expect(Open(), IdxPath(prefix_), "version 2");
}

TEST_F(BadIndex, UnknownDType) {
  idx_[17] = 9;
  WriteAll(IdxPath(prefix_), idx_);
  Expect(Open(), "byte offset 17", "dtype code 9");
}

TEST_F(BadIndex, TruncatedIndex) {
  WriteAll(IdxPath(prefix_), idx_.substr(0, idx_.size() - 3));
  Expect(Open(), IdxPath(prefix_), "truncated");
}

TEST_F(BadIndex, TruncatedBin) {
  WriteAll(BinPath(prefix_), bin_.substr(0, bin_.size() - 1));
  Expect(Open(), "truncated .bin", "sequence 1");
}

TEST_F(BadIndex, PointerPastTheEnd) {
  // Sequence 0's pointer (after header and two lengths) moved far out.
  const int64_t far = 1 << 20;
  std::memcpy(&idx_[34 + 2 * 4], &far, 8);
  WriteAll(IdxPath(prefix_), idx_);
  Expect(Open(), "index points past the end", "byte offset 42");
}

TEST_F(BadIndex, DocumentIndexMustCoverSequences) {
  const int64_t bad = 7;
  std::memcpy(&idx_[idx_.size() - 8], &bad, 8);
  WriteAll(IdxPath(prefix_), idx_);
  Expect(Open(), "document index", "to 7");
}

TEST(IndexedDatasetFromMemory, ReadsWhatOpenReads) {
  const std::string prefix = TempDir("idx_memory") + "/d";
  auto b = IndexedDatasetBuilder::Create(prefix, TokenDType::kInt64);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE((*b)->AddDocument(std::vector<int32_t>{5, 6}).ok());
  ASSERT_TRUE((*b)->AddDocument(std::vector<int32_t>{}).ok());
  ASSERT_TRUE((*b)->Finalize().ok());
  const std::string idx = ReadAll(IdxPath(prefix));
  const std::string bin = ReadAll(BinPath(prefix));
  auto ds = IndexedDataset::FromMemory("mem", idx, bin);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->Get(0), (std::vector<int64_t>{5, 6}));
  // An empty int64 sequence (found by the fuzzer: memcpy to a null vector).
  EXPECT_TRUE((*ds)->Get(1).empty());
  auto bad = IndexedDataset::FromMemory("mem", idx, bin.substr(0, 15));
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("mem.bin"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace mcc::data
