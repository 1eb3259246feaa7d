#include "training/microbatch_calculator.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace training {
namespace {

using ::testing::HasSubstr;

std::string ErrorOf(int64_t global, int64_t mbs, int dp, BatchSizeRampup r) {
  return std::string(
      MicroBatchCalculator::Create(global, mbs, dp, r).status().message());
}

TEST(MicroBatchCalculatorTest, ParsesCommasOrSpaces) {
  auto a = ParseRampupBatchSize("4,4,30");
  ASSERT_TRUE(a.ok() && a->has_value());
  EXPECT_EQ((*a)->start, 4);
  EXPECT_EQ((*a)->increment, 4);
  EXPECT_EQ((*a)->samples, 30);
  auto b = ParseRampupBatchSize(" 32 16  1000 ");
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ((*b)->samples, 1000);
  auto none = ParseRampupBatchSize("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  for (const char* bad : {"4,4", "4,4,30,1", "4,x,30", "4.5,4,30"}) {
    EXPECT_THAT(std::string(ParseRampupBatchSize(bad).status().message()),
                HasSubstr("--rampup-batch-size"))
        << bad;
  }
}

TEST(MicroBatchCalculatorTest, ConstantWithoutRamp) {
  auto c = MicroBatchCalculator::Create(16, 2, 2, std::nullopt);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->ramping());
  EXPECT_EQ(c->GlobalBatchSize(0), 16);
  EXPECT_EQ(c->GlobalBatchSize(1000), 16);
  EXPECT_EQ(c->NumMicroBatches(0), 4);
  EXPECT_THAT(std::string(MicroBatchCalculator::Create(10, 2, 2, std::nullopt)
                              .status()
                              .message()),
              HasSubstr("--global-batch-size (10) is not divisible"));
}

TEST(MicroBatchCalculatorTest, HandValues) {
  // 16 - 4 = 12 = 3 increments of 4 over 30 samples: one every 10.
  auto c = MicroBatchCalculator::Create(16, 1, 2, BatchSizeRampup{4, 4, 30});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->samples_per_increment(), 10.0);
  const std::vector<std::pair<int64_t, int64_t>> expected = {
      {0, 4},   {9, 4},   {10, 8},  {19, 8},  {20, 12},
      {29, 12}, {30, 16}, {31, 16}, {500, 16}};
  for (const auto& [consumed, size] : expected) {
    EXPECT_EQ(c->GlobalBatchSize(consumed), size) << consumed;
    EXPECT_EQ(c->NumMicroBatches(consumed), size / 2) << consumed;
  }
  // A run's steps: each step's size is read at the samples before it.
  std::vector<int64_t> sizes;
  for (int64_t consumed = 0; sizes.size() < 8;) {
    sizes.push_back(c->GlobalBatchSize(consumed));
    consumed += sizes.back();
  }
  // 0, 4, 8 -> 4; 12, 20 -> 8 (12 at 12, 12 + 8 = 20 -> 12); ...
  EXPECT_EQ(sizes, (std::vector<int64_t>{4, 4, 4, 8, 12, 16, 16, 16}));
  // A fractional 2.5 samples per increment, truncated as Megatron's int().
  auto f = MicroBatchCalculator::Create(10, 1, 1, BatchSizeRampup{2, 4, 5});
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->GlobalBatchSize(2), 2);
  EXPECT_EQ(f->GlobalBatchSize(3), 6);
  EXPECT_EQ(f->GlobalBatchSize(4), 6);
  EXPECT_EQ(f->GlobalBatchSize(5), 10);
}

// Megatron's RampupBatchsizeNumMicroBatches.update, restated from its
// definition: past the ramp the global batch; else start plus the whole
// increments done, each rampup_samples / num_increments samples long.
int64_t MegatronGlobalBatch(int64_t start, int64_t incr, int64_t samples,
                            int64_t global, int64_t consumed) {
  if (consumed > samples) return global;
  const double per_increment =
      static_cast<double>(samples) / ((global - start) / incr);
  return start + static_cast<int64_t>(consumed / per_increment) * incr;
}

TEST(MicroBatchCalculatorTest, AgreesWithMegatronsFormula) {
  int cases = 0;
  for (int64_t global : {8, 24, 96, 1536}) {
    for (int64_t start : {1, 2, 8, 32}) {
      for (int64_t incr : {1, 2, 3, 8, 32}) {
        if (start >= global || (global - start) % incr != 0) continue;
        for (int64_t samples : {1, 7, 100, 12345, 3000000}) {
          auto c = MicroBatchCalculator::Create(global, 1, 1,
                                                {{start, incr, samples}});
          ASSERT_TRUE(c.ok()) << c.status();
          for (int64_t consumed = 0; consumed <= samples + 2;
               consumed += 1 + samples / 997) {
            ASSERT_EQ(
                c->GlobalBatchSize(consumed),
                MegatronGlobalBatch(start, incr, samples, global, consumed))
                << global << " " << start << " " << incr << " " << samples
                << " " << consumed;
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_GT(cases, 100);
}

TEST(MicroBatchCalculatorTest, RefusesWhatMegatronAsserts) {
  EXPECT_THAT(ErrorOf(16, 1, 1, {0, 4, 30}), HasSubstr("must all be positive"));
  EXPECT_THAT(ErrorOf(16, 1, 1, {4, 0, 30}), HasSubstr("must all be positive"));
  EXPECT_THAT(ErrorOf(16, 1, 1, {4, 4, 0}), HasSubstr("must all be positive"));
  EXPECT_THAT(ErrorOf(16, 1, 1, {20, 4, 30}), HasSubstr("START must be below"));
  EXPECT_THAT(ErrorOf(16, 1, 1, {16, 4, 30}), HasSubstr("START must be below"));
  EXPECT_THAT(ErrorOf(16, 1, 1, {4, 5, 30}),
              HasSubstr("12 is not a multiple of INCR (5)"));
  for (BatchSizeRampup r : {BatchSizeRampup{0, 4, 30}, {16, 4, 30}}) {
    EXPECT_THAT(ErrorOf(16, 1, 1, r), HasSubstr("--rampup-batch-size"));
  }
}

TEST(MicroBatchCalculatorTest, EverySizeAheadMustDivide) {
  // Micro-batch 2 x DP 2: 4 divides 4, 8, 12, 16 but not 6.
  auto c = MicroBatchCalculator::Create(16, 2, 2, BatchSizeRampup{4, 4, 30});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->CheckDivisibleFrom(0).ok());
  auto odd = MicroBatchCalculator::Create(16, 2, 2, BatchSizeRampup{2, 2, 70});
  ASSERT_TRUE(odd.ok());
  EXPECT_THAT(std::string(odd->CheckDivisibleFrom(0).message()),
              HasSubstr("global batch size 2 is not divisible by "
                        "--micro-batch-size (2) x data-parallel size (2)"));
  // Resumed past the odd sizes (10 samples per increment: at 50 the size
  // is 12, then 14 lies ahead; at 60, 14 is the current size).
  EXPECT_THAT(std::string(odd->CheckDivisibleFrom(50).message()),
              HasSubstr("global batch size 14 (still ahead after 50"));
  EXPECT_TRUE(odd->CheckDivisibleFrom(71).ok());
}

}  // namespace
}  // namespace training
}  // namespace mcc
