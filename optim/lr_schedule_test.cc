#include "optim/lr_schedule.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace optim {
namespace {

TEST(LrScheduleTest, LinearWarmupThenCosineDecayToMin) {
  LrScheduleConfig c;
  c.lr = 1e-3;
  c.min_lr = 1e-5;
  c.warmup_iters = 10;
  c.decay_iters = 110;
  c.decay_style = LrDecayStyle::kCosine;
  LrSchedule s = *LrSchedule::Create(c);
  EXPECT_DOUBLE_EQ(s.LearningRate(0), 0.0);
  EXPECT_DOUBLE_EQ(s.LearningRate(5), 0.5e-3);
  EXPECT_DOUBLE_EQ(s.LearningRate(10), 1e-3);
  // Halfway through the decay the cosine coefficient is one half.
  EXPECT_NEAR(s.LearningRate(60), 1e-5 + 0.5 * (1e-3 - 1e-5), 1e-15);
  EXPECT_DOUBLE_EQ(s.LearningRate(110), 1e-5);
  EXPECT_DOUBLE_EQ(s.LearningRate(1000), 1e-5);
  for (int64_t i = 11; i < 110; ++i) {
    EXPECT_LT(s.LearningRate(i + 1), s.LearningRate(i)) << i;
  }
}

TEST(LrScheduleTest, LinearDecayAndWarmupFraction) {
  LrScheduleConfig c;
  c.lr = 2.0;
  c.min_lr = 0.0;
  c.warmup_fraction = 0.25;
  c.decay_iters = 100;
  c.decay_style = LrDecayStyle::kLinear;
  LrSchedule s = *LrSchedule::Create(c);
  EXPECT_EQ(s.warmup_iters(), 25);
  EXPECT_DOUBLE_EQ(s.LearningRate(25), 2.0);
  EXPECT_DOUBLE_EQ(s.LearningRate(25 + 75 / 3), 2.0 * (1 - 25.0 / 75));
}

TEST(LrScheduleTest, ConstantAfterWarmup) {
  LrScheduleConfig c;
  c.lr = 0.1;
  c.warmup_iters = 4;
  c.decay_style = LrDecayStyle::kConstant;
  LrSchedule s = *LrSchedule::Create(c);
  EXPECT_DOUBLE_EQ(s.LearningRate(2), 0.05);
  EXPECT_DOUBLE_EQ(s.LearningRate(1000000), 0.1);
}

TEST(LrScheduleTest, BadConfigNamesTheFlag) {
  LrScheduleConfig c;
  c.lr = 1e-4;
  c.min_lr = 1e-3;
  EXPECT_THAT(std::string(LrSchedule::Create(c).status().message()),
              ::testing::HasSubstr("--min-lr"));
  EXPECT_THAT(std::string(ParseLrDecayStyle("step").status().message()),
              ::testing::HasSubstr("--lr-decay-style"));
}

}  // namespace
}  // namespace optim
}  // namespace mcc
