#include "planner/published_runs.h"

#include <cmath>
#include <string>

#include "gtest/gtest.h"

namespace mcc {
namespace planner {
namespace {

bool IsMegatron(const PublishedRun& run) {
  return run.name.rfind("Megatron", 0) == 0;
}

// The goal, met by every row (worst 4.0 points when
// this test was written; docs/benchmarks/2026-12-03.md has the table). A
// change to the step-time model or the H100 spec that moves any row past it
// fails here.
constexpr double kMfuBoundPoints = 5;

TEST(PublishedRunsTest, MegatronRowsWithinFiveMfuPoints) {
  int rows = 0;
  for (const PublishedRun& run : PublishedRuns()) {
    if (!IsMegatron(run)) continue;
    ++rows;
    auto c = ComparePublished(run);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_LE(std::fabs(c->mfu_error_points), kMfuBoundPoints)
        << run.name << ": published " << 100 * run.published_mfu
        << "%, predicted " << 100 * c->predicted_mfu << "% with "
        << c->prediction.layout.Name();
    EXPECT_TRUE(c->fits_published_system) << run.name;
  }
  EXPECT_EQ(rows, 17);  // 9 weak-scaling, 8 strong-scaling
}

// torchtitan's row: eager PyTorch (its norms, rotary and SwiGLU counted
// kernel by kernel) on power-capped H100s whose peak is known to 8%. Held to
// the same goal, and its tokens/s to 10% (+2% when this test was written;
// +15% before the eager kernels were counted).
constexpr double kTorchtitanTokensBound = 0.10;
TEST(PublishedRunsTest, TorchtitanRowWithinFiveMfuPoints) {
  int rows = 0;
  for (const PublishedRun& run : PublishedRuns()) {
    if (IsMegatron(run)) continue;
    ++rows;
    auto c = ComparePublished(run);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_LE(std::fabs(c->mfu_error_points), kMfuBoundPoints)
        << run.name << ": published " << 100 * run.published_mfu
        << "%, predicted " << 100 * c->predicted_mfu << "%";
    ASSERT_GT(run.published_tokens_per_gpu, 0);
    const double error =
        c->predicted_tokens_per_gpu / run.published_tokens_per_gpu - 1;
    EXPECT_LE(std::fabs(error), kTorchtitanTokensBound)
        << run.name << ": published " << run.published_tokens_per_gpu
        << " tokens/s/GPU, predicted " << c->predicted_tokens_per_gpu;
    // Counted as fused, the row was 5.1 points high: the eager count is
    // what brings it in, so the flag must stay set.
    EXPECT_FALSE(run.job.fused_elementwise) << run.name;
  }
  EXPECT_EQ(rows, 1);
}

// The transcription: the weak-scaling table's per-GPU teraFLOP/s over the
// 989 TFLOP/s peak rounds to its MFU column, and the strong-scaling ends
// read off the figure agree with the README's 47% and 42%.
TEST(PublishedRunsTest, PublishedFiguresMatchTheirText) {
  const double weak_mfu_column[] = {41, 47, 49, 46, 42, 43, 44, 48, 47};
  const auto runs = PublishedRuns();
  ASSERT_EQ(runs.size(), 18u);
  for (int i = 0; i < 9; ++i) {
    EXPECT_EQ(std::round(100 * runs[i].published_mfu), weak_mfu_column[i])
        << runs[i].name;
  }
  EXPECT_NEAR(100 * runs[9].published_mfu, 47, 0.5) << runs[9].name;
  EXPECT_NEAR(100 * runs[16].published_mfu, 42, 0.5) << runs[16].name;
  for (int i = 9; i < 17; ++i) {
    EXPECT_EQ(runs[i].job.cluster.world() % 48, 0) << runs[i].name;
    EXPECT_EQ(runs[i].job.global_batch, 1152) << runs[i].name;
  }
}

// The H100's GEMM share of peak was calibrated on the 96-GPU strong-scaling
// row (planner/device_spec.cc): that row must sit on it.
TEST(PublishedRunsTest, CalibrationRowIsMatched) {
  const PublishedRun run = PublishedRuns()[9];
  ASSERT_EQ(run.job.cluster.world(), 96);
  auto c = ComparePublished(run);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_LE(std::fabs(c->mfu_error_points), 0.5);
}

// Without the --tp-comm-overlap model the TP-only weak-scaling rows miss
// the goal: the overlap is part of why the rows agree, not an idle switch.
TEST(PublishedRunsTest, TpCommOverlapIsNeeded) {
  PublishedRun run = PublishedRuns()[3];  // 32B, TP 8 x DP 48
  ASSERT_EQ(run.layout.tp, 8);
  run.job.overlap_tp_comm = false;
  auto c = ComparePublished(run);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_LT(c->mfu_error_points, -kMfuBoundPoints);
}

// The comparison predicts what the planner predicts for the chosen layout.
TEST(PublishedRunsTest, ComparisonIsThePlannersPrediction) {
  const PublishedRun run = PublishedRuns()[6];  // 177B, TP 8 x PP 6 x DP 48
  auto c = ComparePublished(run);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->prediction.layout.tp, 8);
  EXPECT_EQ(c->prediction.layout.pp, 6);
  EXPECT_EQ(c->prediction.layout.dp, 48);
  auto p = Predict(run.job, c->prediction.layout);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(c->predicted_mfu, p->time.mfu);
  EXPECT_NEAR(c->mfu_error_points, 100 * (p->time.mfu - run.published_mfu),
              1e-9);
}

}  // namespace
}  // namespace planner
}  // namespace mcc
