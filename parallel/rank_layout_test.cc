#include "parallel/rank_layout.h"

#include <algorithm>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace parallel {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every rank appears in exactly one group, and all groups have one size.
void ExpectPartition(const std::vector<std::vector<int>>& groups, int world,
                     size_t group_size) {
  std::multiset<int> seen;
  for (const auto& g : groups) {
    EXPECT_EQ(g.size(), group_size);
    seen.insert(g.begin(), g.end());
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) EXPECT_EQ(seen.count(r), 1u) << r;
}

TEST(RankLayoutTest, MegatronExampleSixteenRanks) {
  // Megatron's documented example: 16 ranks, TP 2, PP 4 -> DP 2.
  RankLayout l = *RankLayout::Create(16, {/*tensor=*/2, /*pipeline=*/4, 1});
  EXPECT_EQ(l.data_size(), 2);
  EXPECT_THAT(
      l.TensorGroups(),
      ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3), ElementsAre(4, 5),
                  ElementsAre(6, 7), ElementsAre(8, 9), ElementsAre(10, 11),
                  ElementsAre(12, 13), ElementsAre(14, 15)));
  EXPECT_THAT(
      l.DataGroups(),
      ElementsAre(ElementsAre(0, 2), ElementsAre(1, 3), ElementsAre(4, 6),
                  ElementsAre(5, 7), ElementsAre(8, 10), ElementsAre(9, 11),
                  ElementsAre(12, 14), ElementsAre(13, 15)));
  EXPECT_THAT(
      l.PipelineGroups(),
      ElementsAre(ElementsAre(0, 4, 8, 12), ElementsAre(1, 5, 9, 13),
                  ElementsAre(2, 6, 10, 14), ElementsAre(3, 7, 11, 15)));
  EXPECT_THAT(l.EmbeddingGroups(),
              ElementsAre(ElementsAre(0, 12), ElementsAre(1, 13),
                          ElementsAre(2, 14), ElementsAre(3, 15)));
  EXPECT_THAT(l.ModelGroups()[0], ElementsAre(0, 1, 4, 5, 8, 9, 12, 13));
}

TEST(RankLayoutTest, CoordinatesRoundTripAndGroupsPartition) {
  for (int tp : {1, 2, 4}) {
    for (int cp : {1, 2}) {
      for (int pp : {1, 2}) {
        const int world = tp * cp * pp * 2;
        RankLayout l = *RankLayout::Create(world, {tp, pp, cp});
        for (int r = 0; r < world; ++r) {
          const RankCoordinates c = l.Coordinates(r);
          EXPECT_EQ(l.RankOf(c), r);
          // A rank's index in its TP group is its TP coordinate.
          const std::vector<int> tg = RankLayout::GroupOf(l.TensorGroups(), r);
          EXPECT_EQ(std::find(tg.begin(), tg.end(), r) - tg.begin(), c.tp);
          const std::vector<int> pg =
              RankLayout::GroupOf(l.PipelineGroups(), r);
          EXPECT_EQ(std::find(pg.begin(), pg.end(), r) - pg.begin(), c.pp);
        }
        ExpectPartition(l.TensorGroups(), world, tp);
        ExpectPartition(l.PipelineGroups(), world, pp);
        ExpectPartition(l.ContextGroups(), world, cp);
        ExpectPartition(l.DataGroups(), world, 2);
        ExpectPartition(l.DataContextGroups(), world, 2 * cp);
        ExpectPartition(l.TensorContextGroups(), world, tp * cp);
        ExpectPartition(l.ModelGroups(), world, tp * pp);
      }
    }
  }
}

TEST(RankLayoutTest, IndivisibleWorldShowsTheNumbers) {
  absl::Status s = RankLayout::Create(6, {4, 1, 1}).status();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("world size 6"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("tensor-model-parallel-size (4)"));
  EXPECT_FALSE(RankLayout::Create(4, {0, 1, 1}).ok());
}

}  // namespace
}  // namespace parallel
}  // namespace mcc
