#include "optim/loss_scaler.h"

#include "gtest/gtest.h"

namespace mcc {
namespace optim {
namespace {

TEST(LossScalerTest, BacksOffAfterHysteresisAndGrowsAfterWindow) {
  LossScalerConfig c;
  c.initial_scale = 1024;
  c.min_scale = 1;
  c.growth_interval = 3;
  c.hysteresis = 2;
  LossScaler s = *LossScaler::Create(c);
  s.Update(true);  // First overflow: hysteresis absorbs it.
  EXPECT_EQ(s.scale(), 1024);
  s.Update(true);  // Second in a row: back off.
  EXPECT_EQ(s.scale(), 512);
  s.Update(true);  // Tracker stays at or below zero: back off again.
  EXPECT_EQ(s.scale(), 256);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale(), 256);
  s.Update(false);  // Three clean steps: grow, and hysteresis resets.
  EXPECT_EQ(s.scale(), 512);
  s.Update(true);
  EXPECT_EQ(s.scale(), 512);
}

TEST(LossScalerTest, NeverBelowMinimum) {
  LossScalerConfig c;
  c.initial_scale = 4;
  c.min_scale = 2;
  c.hysteresis = 1;
  LossScaler s = *LossScaler::Create(c);
  for (int i = 0; i < 5; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 2);
}

TEST(LossScalerTest, StaticScaleNeverChanges) {
  LossScalerConfig c;
  c.static_scale = 128;
  LossScaler s = *LossScaler::Create(c);
  s.Update(true);
  s.Update(true);
  EXPECT_EQ(s.scale(), 128);
  EXPECT_FALSE(s.is_dynamic());
}

TEST(LossScalerTest, RejectsBadConfig) {
  LossScalerConfig c;
  c.min_scale = 8;
  c.initial_scale = 4;
  EXPECT_FALSE(LossScaler::Create(c).ok());
}

}  // namespace
}  // namespace optim
}  // namespace mcc
