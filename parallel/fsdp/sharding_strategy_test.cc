#include "parallel/fsdp/sharding_strategy.h"

#include "gtest/gtest.h"

namespace mcc {
namespace fsdp {
namespace {

TEST(ShardingStrategyTest, MegatronNamesRoundTrip) {
  for (const char* name :
       {"no_shard", "optim", "optim_grads", "optim_grads_params"}) {
    auto s = ParseShardingStrategy(name);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(ShardingStrategyName(*s), name);
  }
  EXPECT_TRUE(ShardsGradients(ShardingStrategy::kOptimGrads));
  EXPECT_FALSE(ShardsGradients(ShardingStrategy::kOptim));
}

TEST(ShardingStrategyTest, UnknownNameNamesTheFlag) {
  auto s = ParseShardingStrategy("full_shard");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--data-parallel-sharding-strategy"),
            std::string::npos);
  EXPECT_NE(s.status().message().find("full_shard"), std::string::npos);
}

}  // namespace
}  // namespace fsdp
}  // namespace mcc
