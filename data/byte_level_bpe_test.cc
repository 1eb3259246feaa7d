#include "data/byte_level_bpe.h"

#include <string>
#include <vector>

#include "data/unicode_text.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

// The UTF-8 of code point cp.
std::string Utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

TEST(ByteLevelToBytesTest, ReadsEveryByteBackFromGpt2Alphabet) {
  const std::vector<uint32_t> b2u = BytesToUnicode();
  std::string mapped, expected;
  for (int b = 0; b < 256; ++b) {
    mapped += Utf8(b2u[b]);
    expected.push_back(static_cast<char>(b));
  }
  std::string bytes = "stale";
  ASSERT_TRUE(ByteLevelToBytes(mapped, &bytes));
  EXPECT_EQ(bytes, expected);
  // GPT-2 writes a space as U+0120 ("Ġ").
  ASSERT_TRUE(ByteLevelToBytes("\xC4\xA0the", &bytes));
  EXPECT_EQ(bytes, " the");
}

TEST(ByteLevelToBytesTest, RefusesCharactersOutsideTheAlphabet) {
  std::string bytes;
  EXPECT_FALSE(ByteLevelToBytes(" ", &bytes));  // A raw space is mapped.
  EXPECT_FALSE(ByteLevelToBytes("\xE4\xB8\xAD", &bytes));  // U+4E2D
  EXPECT_FALSE(ByteLevelToBytes("a\xFF", &bytes));         // Not UTF-8.
}

TEST(FillByteIdsTest, NamesTheFirstByteWithoutAToken) {
  absl::flat_hash_map<std::string, int32_t> vocab;
  for (int b = 0; b < 256; ++b) vocab[std::string(1, char(b))] = 300 - b;
  int32_t byte_id[256];
  EXPECT_EQ(FillByteIds(vocab, byte_id), -1);
  EXPECT_EQ(byte_id[0], 300);
  EXPECT_EQ(byte_id[255], 45);
  vocab.erase(std::string(1, 'A'));
  vocab.erase(std::string(1, 'z'));
  EXPECT_EQ(FillByteIds(vocab, byte_id), 'A');
}

TEST(ByteLevelBpeTest, MergesTheLowestRankFirstUntilNoneApplies) {
  int32_t byte_id[256];
  for (int b = 0; b < 256; ++b) byte_id[b] = b;
  BpeMerges merges;
  // ab -> 256 (rank 1), bc -> 257 (rank 0), a + 257 -> 258 (rank 2).
  merges[BpeMergeKey('a', 'b')] = {1, 256};
  merges[BpeMergeKey('b', 'c')] = {0, 257};
  merges[BpeMergeKey('a', 257)] = {2, 258};
  EXPECT_EQ(ByteLevelBpe("abc", byte_id, merges), (std::vector<int32_t>{258}));
  EXPECT_EQ(ByteLevelBpe("abab", byte_id, merges),
            (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(ByteLevelBpe("xa", byte_id, merges),
            (std::vector<int32_t>{'x', 'a'}));
  EXPECT_TRUE(ByteLevelBpe("", byte_id, merges).empty());
}

TEST(BpeMergeKeyTest, KeepsBothIdsApart) {
  EXPECT_NE(BpeMergeKey(1, 2), BpeMergeKey(2, 1));
  EXPECT_EQ(BpeMergeKey(1, 2), (uint64_t{1} << 32) | 2);
}

}  // namespace
}  // namespace mcc::data
