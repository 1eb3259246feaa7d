#include "planner/cpu_probe.h"

#include <chrono>
#include <cstdlib>
#include <thread>

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

// A shaped GEMM faster than the 1024^3 one keeps its own rate in the model:
// the peak rises to it rather than the efficiency stopping at 1.
TEST(CpuProbeTest, TheShapedRateIsNotCappedAtTheCubes) {
  DeviceSpec d;
  SetGemmRates(/*peak=*/100e9, /*shaped=*/400e9, /*shaped_small=*/200e9, 1024,
               256, &d);
  EXPECT_DOUBLE_EQ(d.PeakFlops(DType::kBFloat16) * GemmEfficiencyAt(d, 1024),
                   400e9);
  EXPECT_DOUBLE_EQ(d.PeakFlops(DType::kBFloat16) * GemmEfficiencyAt(d, 256),
                   200e9);
  // A cube faster than the shapes stays the peak.
  SetGemmRates(500e9, 400e9, 200e9, 1024, 256, &d);
  EXPECT_DOUBLE_EQ(d.PeakFlops(DType::kFloat32), 500e9);
  EXPECT_DOUBLE_EQ(d.gemm_efficiency, 0.8);
}

// MCC_PROBE_CLOCK=thread_cpu times a call by the calling thread's CPU time:
// a sleep does not count, a spin does; work on other threads is timed by
// the wall clock.
TEST(CpuProbeTest, ThreadCpuClockCountsOnlyThisThreadsWork) {
  setenv("MCC_PROBE_CLOCK", "thread_cpu", 1);
  double t0 = ProbeClockSeconds(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_LT(ProbeClockSeconds(true) - t0, 0.05);
  t0 = ProbeClockSeconds(true);
  const double wall0 = ProbeClockSeconds(false);
  volatile double sink = 0;
  while (ProbeClockSeconds(true) - t0 < 0.03) sink = sink + 1;
  EXPECT_GE(ProbeClockSeconds(false) - wall0, 0.03);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GE(ProbeClockSeconds(false) - wall0, 0.13);
}

// The probe's kernels run on the threads a rank of the run gets: train's
// --num-threads where set (a --num-threads 1 run on 2 cores had been
// probed with 2-thread GEMMs), else the cores shared over the ranks.
TEST(CpuProbeTest, ThreadsPerRankFollowNumThreads) {
  EXPECT_EQ(ProbeThreadsPerRank(2, 1, 1), 1);
  EXPECT_EQ(ProbeThreadsPerRank(2, 1, 0), 2);
  EXPECT_EQ(ProbeThreadsPerRank(2, 2, 0), 1);
  EXPECT_EQ(ProbeThreadsPerRank(2, 4, 0), 1);
  EXPECT_EQ(ProbeThreadsPerRank(16, 4, 0), 4);
  EXPECT_EQ(ProbeThreadsPerRank(16, 4, 2), 2);
}

}  // namespace
}  // namespace planner
}  // namespace mcc
