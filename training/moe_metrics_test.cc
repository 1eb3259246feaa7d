#include "training/moe_metrics.h"

#include <map>

#include "gtest/gtest.h"

namespace mcc {
namespace training {
namespace {

gpt::MoeLayerStats Layer(int layer, std::vector<int64_t> tokens) {
  gpt::MoeLayerStats s;
  s.layer = layer;
  s.tokens_per_expert = std::move(tokens);
  s.aux_loss_sum = 0.5;
  s.z_loss_sum = 0.25;
  s.micro_batches = 2;
  return s;
}

TEST(MoeMetricsTest, LineShowsLoadImbalanceAndLossesPerMicroBatch) {
  EXPECT_EQ(MoeStatsLine(Layer(3, {12, 20, 16, 16})),
            "moe layer 3: tokens per expert [12 20 16 16] (max/mean 1.25) | "
            "balance loss 2.5000E-01 | z-loss 1.2500E-01");
}

TEST(MoeMetricsTest, ScalarsPerLayerAndMeanOverLayers) {
  gpt::MoeLayerStats other = Layer(1, {0, 8});
  other.aux_loss_sum = 1.5;
  std::map<std::string, double> s;
  for (const auto& [tag, value] : MoeScalars({other, Layer(3, {4, 4})})) {
    s[tag] = value;
  }
  EXPECT_DOUBLE_EQ(s.at("moe/load_balancing_loss_layer_1"), 0.75);
  EXPECT_DOUBLE_EQ(s.at("moe/load_balancing_loss_layer_3"), 0.25);
  EXPECT_DOUBLE_EQ(s.at("load_balancing_loss"), 0.5);
  EXPECT_DOUBLE_EQ(s.at("z_loss"), 0.125);
  EXPECT_DOUBLE_EQ(s.at("moe/max_over_mean_load_layer_1"), 2.0);
  EXPECT_DOUBLE_EQ(s.at("moe/max_over_mean_load_layer_3"), 1.0);
  EXPECT_DOUBLE_EQ(s.at("moe/tokens_layer_1_expert_1"), 8);
  EXPECT_TRUE(MoeScalars({}).empty());
}

}  // namespace
}  // namespace training
}  // namespace mcc
