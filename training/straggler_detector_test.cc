// The straggler report: the analysis alone, then in real processes a rank
// slowed by an injected delay is named, and only that rank.
#include "training/straggler_detector.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace training {
namespace {

TEST(AnalyzeStepTimesTest, NamesOnlyTheRankAboveTheThreshold) {
  StragglerReport report = AnalyzeStepTimes({{1.0, 0.50, 0.30},
                                             {1.0, 0.52, 0.31},
                                             {1.0, 0.90, 0.55},
                                             {1.0, 0.49, 0.30}},
                                            1.2);
  EXPECT_DOUBLE_EQ(report.median_busy_seconds, 0.50);
  EXPECT_DOUBLE_EQ(report.median_gemm_seconds, 0.30);
  EXPECT_EQ(report.stragglers, std::vector<int>({2}));
  const std::string line = report.Format(1);
  EXPECT_NE(line.find("slowest: rank 2 busy 0.900 s (1.80x)"),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("fastest: rank 3"), std::string::npos) << line;
  EXPECT_NE(line.find("stragglers (above 1.20x): rank 2 (1.80x the median)"),
            std::string::npos)
      << line;
}

TEST(AnalyzeStepTimesTest, EvenRanksNameNoneAndSlowestFirst) {
  StragglerReport even =
      AnalyzeStepTimes({{1, 0.5, 0.3}, {1, 0.55, 0.3}, {1, 0.52, 0.3}}, 1.2);
  EXPECT_TRUE(even.stragglers.empty());
  EXPECT_NE(even.Format(2).find("stragglers (above 1.20x): none"),
            std::string::npos);
  StragglerReport two_slow = AnalyzeStepTimes(
      {{1, 0.5, 0}, {1, 0.8, 0}, {1, 0.5, 0}, {1, 1.0, 0}}, 1.2);
  EXPECT_EQ(two_slow.stragglers, std::vector<int>({3, 1}));
}

TEST(AnalyzeStepTimesTest, TwoRanksCompareWithTheFaster) {
  // The lower median: one slow rank of two is measured against the other.
  StragglerReport report = AnalyzeStepTimes({{1, 0.2, 0}, {1, 0.6, 0}}, 1.5);
  EXPECT_DOUBLE_EQ(report.median_busy_seconds, 0.2);
  EXPECT_EQ(report.stragglers, std::vector<int>({1}));
}

// Every rank runs 6 steps of one all-reduce; the rank in MCC_SLOW_RANK also
// sleeps 60 ms a step outside the collective, so its peers wait for it.
MCC_WORKER(slowed_rank) {
  comm::GroupOptions group_options;
  group_options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(group_options);
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  const int slow = std::atoi(std::getenv("MCC_SLOW_RANK"));
  StragglerDetector detector(world->group.get(), 1.5);
  for (int step = 0; step < 6; ++step) {
    if (world->group->rank() == slow) absl::SleepFor(absl::Milliseconds(60));
    Tensor t = Tensor::Full({1024}, 1.0, DType::kFloat32);
    absl::Status s = world->group->AllReduceSync(&t, comm::ReduceOp::kSum);
    if (!s.ok()) return comm::testing::ReportFailure("all-reduce", s, 3);
  }
  auto report = detector.EndWindow(6);
  if (!report.ok()) {
    return comm::testing::ReportFailure("report", report.status(), 3);
  }
  fprintf(stderr, "%s\n", report->Format(1).c_str());
  return report->stragglers == std::vector<int>({slow}) ? 0 : 4;
}

TEST(StragglerDetectorTest, NamesTheDelayedRankAndOnlyIt) {
  auto results =
      comm::testing::RunWorkers(3, "slowed_rank", absl::Seconds(60), [](int) {
        return std::map<std::string, std::string>{{"MCC_SLOW_RANK", "1"}};
      });
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
    EXPECT_NE(r.output.find("stragglers (above 1.50x): rank 1 ("),
              std::string::npos)
        << comm::testing::Describe(results);
  }
}

}  // namespace
}  // namespace training
}  // namespace mcc
