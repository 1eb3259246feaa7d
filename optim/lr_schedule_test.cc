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

// Warmup to lr = 1 over 10 iterations, lr held to iteration 80, then the
// last 20 of 100 iterations anneal to min_lr = 0.1. The expected rates were
// worked out by hand from each curve's formula (coefficient c of the
// fraction r of the annealing done; lr = 0.1 + 0.9 c):
// exponential c = 2 * 0.5^r - 1, linear 1 - r, cosine (cos(pi r) + 1) / 2,
// minus_sqrt 1 - sqrt(r).
TEST(LrScheduleTest, WarmupStableDecayFollowsEachAnnealingCurve) {
  struct Case {
    WsdDecayStyle style;
    double at_85;  // r = 1/4
    double at_90;  // r = 1/2
  };
  const Case cases[] = {
      {WsdDecayStyle::kExponential, 0.71361354745668, 0.47279220613579},
      {WsdDecayStyle::kLinear, 0.775, 0.55},
      {WsdDecayStyle::kCosine, 0.86819805153395, 0.55},
      {WsdDecayStyle::kMinusSqrt, 0.55, 0.36360389693211},
  };
  for (const Case& k : cases) {
    LrScheduleConfig c;
    c.lr = 1.0;
    c.min_lr = 0.1;
    c.warmup_iters = 10;
    c.decay_iters = 100;
    c.decay_style = LrDecayStyle::kWsd;
    c.wsd_decay_iters = 20;
    c.wsd_decay_style = k.style;
    LrSchedule s = *LrSchedule::Create(c);
    const int style = static_cast<int>(k.style);
    EXPECT_DOUBLE_EQ(s.LearningRate(5), 0.5) << style;
    EXPECT_DOUBLE_EQ(s.LearningRate(11), 1.0) << style;
    EXPECT_DOUBLE_EQ(s.LearningRate(80), 1.0) << style;
    EXPECT_NEAR(s.LearningRate(85), k.at_85, 1e-12) << style;
    EXPECT_NEAR(s.LearningRate(90), k.at_90, 1e-12) << style;
    EXPECT_NEAR(s.LearningRate(100), 0.1, 1e-12) << style;
    EXPECT_DOUBLE_EQ(s.LearningRate(101), 0.1) << style;
    for (int64_t i = 80; i < 100; ++i) {
      EXPECT_LT(s.LearningRate(i + 1), s.LearningRate(i)) << style << " " << i;
    }
  }
}

TEST(LrScheduleTest, WsdNeedsItsDecayLength) {
  LrScheduleConfig c;
  c.decay_iters = 100;
  c.decay_style = LrDecayStyle::kWsd;
  EXPECT_THAT(std::string(LrSchedule::Create(c).status().message()),
              ::testing::HasSubstr("--lr-wsd-decay-iters"));
  EXPECT_EQ(*ParseLrDecayStyle("WSD"), LrDecayStyle::kWsd);
  EXPECT_EQ(*ParseWsdDecayStyle("minus_sqrt"), WsdDecayStyle::kMinusSqrt);
  EXPECT_THAT(std::string(ParseWsdDecayStyle("step").status().message()),
              ::testing::HasSubstr("--lr-wsd-decay-style"));
}

TEST(LrScheduleTest, FractionalPositionsFollowTheSameCurve) {
  // Megatron's sample-counted schedule under a batch-size ramp: the rate at
  // s samples is the curve at s / global batch iterations.
  LrScheduleConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_iters = 4;
  c.decay_iters = 20;
  c.decay_style = LrDecayStyle::kLinear;
  LrSchedule s = *LrSchedule::Create(c);
  // Warmup halfway to iteration 1 (samples 4 of a global batch 8).
  EXPECT_DOUBLE_EQ(s.LearningRateAt(0.5), 0.125);
  // Decay: 9.5 iterations is 5.5 of the 16 decaying ones.
  EXPECT_DOUBLE_EQ(s.LearningRateAt(9.5), 0.1 + 0.9 * (1 - 5.5 / 16));
  EXPECT_DOUBLE_EQ(s.LearningRateAt(20.5), 0.1);
  // Whole iterations: bit for bit the integer path, every style.
  for (LrDecayStyle style :
       {LrDecayStyle::kConstant, LrDecayStyle::kLinear, LrDecayStyle::kCosine,
        LrDecayStyle::kInverseSquareRoot, LrDecayStyle::kWsd}) {
    c.decay_style = style;
    c.wsd_decay_iters = 6;
    LrSchedule t = *LrSchedule::Create(c);
    for (int64_t i = 0; i <= 25; ++i) {
      EXPECT_EQ(t.LearningRateAt(static_cast<double>(i)), t.LearningRate(i));
    }
  }
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
