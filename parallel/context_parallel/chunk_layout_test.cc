#include "parallel/context_parallel/chunk_layout.h"

#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace context_parallel {
namespace {

TEST(ChunkLayoutTest, RankHoldsChunksIAnd2CMinus1MinusI) {
  // C = 2, S = 8: chunks of 2; rank 0 holds 0 and 3, rank 1 holds 1 and 2.
  auto r0 = ChunkLayout::Create(2, 0, 8).value();
  auto r1 = ChunkLayout::Create(2, 1, 8).value();
  std::vector<int64_t> p0, p1;
  for (int t = 0; t < 4; ++t) {
    p0.push_back(r0.GlobalPosition(t));
    p1.push_back(r1.GlobalPosition(t));
  }
  EXPECT_EQ(p0, (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(p1, (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(r1.ToString(), "CP rank 1 of 2: chunks 1, 2 of 2 tokens");
}

TEST(ChunkLayoutTest, EveryPositionHeldOnceAndInOrderPerRank) {
  const int c = 4;
  const int64_t s = 32;
  std::vector<int> seen(s, 0);
  for (int r = 0; r < c; ++r) {
    auto layout = ChunkLayout::Create(c, r, s).value();
    for (int64_t t = 0; t < layout.local_length(); ++t) {
      ++seen[layout.GlobalPosition(t)];
      if (t > 0) {
        EXPECT_LT(layout.GlobalPosition(t - 1), layout.GlobalPosition(t));
      }
    }
  }
  for (int64_t p = 0; p < s; ++p) EXPECT_EQ(seen[p], 1) << p;
}

TEST(ChunkLayoutTest, SlicesTokensOfEverySequence) {
  std::vector<int64_t> ids;
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t < 8; ++t) ids.push_back(100 * b + t);
  }
  const Tensor full = Tensor::FromInts(ids, {2, 8}).value();
  auto layout = ChunkLayout::Create(2, 0, 8).value();
  auto local = layout.SliceSequence(full);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->shape(), (Shape{2, 4}));
  EXPECT_EQ(local->ToDoubles(),
            (std::vector<double>{0, 1, 6, 7, 100, 101, 106, 107}));
}

TEST(ChunkLayoutTest, RejectsSequencesThatDoNotSplit) {
  auto bad = ChunkLayout::Create(4, 0, 12);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("12"), std::string::npos);
  EXPECT_FALSE(ChunkLayout::Create(2, 2, 8).ok());
  auto layout = ChunkLayout::Create(2, 0, 8).value();
  EXPECT_FALSE(layout.SliceSequence(Tensor::Zeros({2, 6}, DType::kInt64)).ok());
}

}  // namespace
}  // namespace context_parallel
}  // namespace mcc
