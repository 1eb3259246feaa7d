#include "checkpoint/dist_context.h"

#include <limits>

#include "gtest/gtest.h"

namespace mcc {
namespace {

TEST(CheckAllGatherSizesTest, AcceptsCountsWithinTheLimit) {
  EXPECT_TRUE(CheckAllGatherSizes({}).ok());
  EXPECT_TRUE(CheckAllGatherSizes({0, 7, 1 << 20}).ok());
  EXPECT_TRUE(CheckAllGatherSizes({10, 10}, 10).ok());
}

// A peer's count reached Tensor::Empty (a CHECK on a negative extent) or an
// allocation of whatever it announced.
TEST(CheckAllGatherSizesTest, NamesThePeerAnnouncingABadCount) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  struct Case {
    std::vector<int64_t> sizes;
    int64_t limit;
    std::string rank;
  } cases[] = {
      {{5, -1, 3}, kMaxAllGatherBytesPerRank, "rank 1 "},
      {{5, 3, kMax}, kMaxAllGatherBytesPerRank, "rank 2 "},
      {{kMaxAllGatherBytesPerRank + 1}, kMaxAllGatherBytesPerRank, "rank 0 "},
      {{4, 4, 11}, 10, "rank 2 "},
  };
  for (const Case& c : cases) {
    const absl::Status s = CheckAllGatherSizes(c.sizes, c.limit);
    EXPECT_TRUE(absl::IsDataLoss(s)) << s;
    EXPECT_NE(s.message().find(c.rank), std::string::npos) << s;
  }
  // Many ranks at the limit: the total stays countable, or is refused.
  std::vector<int64_t> many(1000, kMaxAllGatherBytesPerRank);
  EXPECT_TRUE(CheckAllGatherSizes(many).ok());
  EXPECT_FALSE(CheckAllGatherSizes({kMax / 2, kMax / 2}, kMax).ok());
}

}  // namespace
}  // namespace mcc
