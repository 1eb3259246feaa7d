// ExitConditions: each condition alone, the handler's install and restore,
// and in real processes the agreement: a SIGTERM that reaches one rank only
// stops every rank after the same step.
#include "training/exit_conditions.h"

#include <signal.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace training {
namespace {

TEST(ExitConditionsTest, NothingWatchedNeverStops) {
  auto conditions = ExitConditions::Create({}, absl::Now(), nullptr);
  ASSERT_TRUE(conditions.ok()) << conditions.status();
  for (int64_t i = 1; i <= 5; ++i) {
    EXPECT_EQ(*(*conditions)->After(i), ExitReason::kNone);
  }
}

TEST(ExitConditionsTest, IntervalStopsAtItsMultiples) {
  ExitOptions options;
  options.interval = 3;
  auto conditions = ExitConditions::Create(options, absl::Now(), nullptr);
  ASSERT_TRUE(conditions.ok()) << conditions.status();
  EXPECT_EQ(*(*conditions)->After(2), ExitReason::kNone);
  EXPECT_EQ(*(*conditions)->After(3), ExitReason::kInterval);
  EXPECT_EQ(*(*conditions)->After(4), ExitReason::kNone);
  EXPECT_EQ(*(*conditions)->After(6), ExitReason::kInterval);
}

TEST(ExitConditionsTest, DurationStopsOnceSpent) {
  ExitOptions options;
  options.max_duration = absl::Minutes(1);
  auto young = ExitConditions::Create(options, absl::Now(), nullptr);
  ASSERT_TRUE(young.ok());
  EXPECT_EQ(*(*young)->After(1), ExitReason::kNone);
  auto old = ExitConditions::Create(
      options, absl::Now() - absl::Minutes(1) - absl::Seconds(1), nullptr);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(*(*old)->After(1), ExitReason::kDuration);
}

TEST(ExitConditionsTest, BadOptionsAreRefused) {
  ExitOptions negative_interval;
  negative_interval.interval = -1;
  EXPECT_FALSE(
      ExitConditions::Create(negative_interval, absl::Now(), nullptr).ok());
  ExitOptions zero_duration;
  zero_duration.max_duration = absl::ZeroDuration();
  EXPECT_FALSE(
      ExitConditions::Create(zero_duration, absl::Now(), nullptr).ok());
}

void Ignore(int) {}

TEST(ExitConditionsTest, SigtermIsCaughtThenTheOldHandlerRestored) {
  struct sigaction mine = {};
  mine.sa_handler = Ignore;
  sigemptyset(&mine.sa_mask);
  struct sigaction before;
  ASSERT_EQ(sigaction(SIGTERM, &mine, &before), 0);
  {
    ExitOptions options;
    options.on_signal = true;
    auto conditions = ExitConditions::Create(options, absl::Now(), nullptr);
    ASSERT_TRUE(conditions.ok()) << conditions.status();
    // A second watcher would steal the first one's handler.
    EXPECT_FALSE(ExitConditions::Create(options, absl::Now(), nullptr).ok());
    EXPECT_EQ(*(*conditions)->After(1), ExitReason::kNone);
    // Without the handler this would end the test process.
    ASSERT_EQ(raise(SIGTERM), 0);
    EXPECT_EQ(*(*conditions)->After(2), ExitReason::kSignal);
  }
  struct sigaction after;
  ASSERT_EQ(sigaction(SIGTERM, &before, &after), 0);
  EXPECT_EQ(after.sa_handler, &Ignore);
}

// Rank 1 alone gets SIGTERM before step 3; both ranks must stop after step
// 3 and no other. Prints "stopped after N" for the test to read.
MCC_WORKER(sigterm_one_rank) {
  comm::GroupOptions group_options;
  group_options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(group_options);
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  ExitOptions options;
  options.on_signal = true;
  auto conditions =
      ExitConditions::Create(options, absl::Now(), world->group.get());
  if (!conditions.ok()) {
    return comm::testing::ReportFailure("create", conditions.status(), 3);
  }
  for (int64_t iteration = 1; iteration <= 10; ++iteration) {
    if (iteration == 3 && world->group->rank() == 1) raise(SIGTERM);
    auto reason = (*conditions)->After(iteration);
    if (!reason.ok()) {
      return comm::testing::ReportFailure("after", reason.status(), 3);
    }
    if (*reason != ExitReason::kNone) {
      fprintf(stderr, "stopped after %lld: %s\n",
              static_cast<long long>(iteration),
              DescribeExitReason(*reason, options).c_str());
      return 0;
    }
  }
  fprintf(stderr, "never stopped\n");
  return 4;
}

TEST(ExitConditionsTest, ASignalToOneRankStopsEveryRankAfterTheSameStep) {
  auto results =
      comm::testing::RunWorkers(2, "sigterm_one_rank", absl::Seconds(60));
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
    EXPECT_NE(r.output.find("stopped after 3: SIGTERM received"),
              std::string::npos)
        << comm::testing::Describe(results);
  }
}

}  // namespace
}  // namespace training
}  // namespace mcc
