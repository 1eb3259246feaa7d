#include "planner/cpu_probe.h"

#include "gtest/gtest.h"

namespace mcc {
namespace planner {
namespace {

TEST(CpuProbeTest, RanksSplitTheCopyBandwidthOfTheCoresTheyRunOn) {
  // Fewer ranks than cores all run at once and split the node's bandwidth.
  EXPECT_DOUBLE_EQ(RankMemoryBandwidth(8e9, 1, 2), 8e9);
  EXPECT_DOUBLE_EQ(RankMemoryBandwidth(8e9, 2, 2), 4e9);
  EXPECT_DOUBLE_EQ(RankMemoryBandwidth(8e9, 2, 8), 4e9);
  // More ranks than cores take turns: the ones running (one a core) split
  // it; core_share accounts for the turns.
  EXPECT_DOUBLE_EQ(RankMemoryBandwidth(8e9, 4, 2), 4e9);
  EXPECT_DOUBLE_EQ(RankMemoryBandwidth(8e9, 8, 2), 4e9);
  // A machine that reports no cores counts as one.
  EXPECT_DOUBLE_EQ(RankMemoryBandwidth(8e9, 4, 0), 8e9);
}

}  // namespace
}  // namespace planner
}  // namespace mcc
