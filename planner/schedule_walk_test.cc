#include "planner/schedule_walk.h"

#include "gtest/gtest.h"
#include "parallel/pipeline/schedules.h"

namespace mcc {
namespace planner {
namespace {

using pipeline::ScheduleOp;
using pipeline::ScheduleRow;

double UnitTimes(const ScheduleRow& row, double f, double b, double w) {
  switch (row.op) {
    case ScheduleOp::kForward:
      return f;
    case ScheduleOp::kBackward:
      return b;
    case ScheduleOp::kWeight:
      return w;
  }
  return 0;
}

// The layout's table is the executor's: 1F1B, interleaved, ZB-H1.
TEST(ScheduleWalkTest, LayoutsGetTheExecutorsTables) {
  JobSpec job;
  Layout l;
  l.pp = 4;
  auto one = LayoutScheduleTable(job, l, 8);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE(SplitsBackward(*one));
  auto expected = pipeline::GenerateScheduleTable(
      pipeline::ScheduleKind::kOneFOneB, {4, 1, 8});
  ASSERT_TRUE(expected.ok());
  ASSERT_EQ(one->rows.size(), expected->rows.size());
  l.schedule = PipelineSchedule::kZeroBubbleH1;
  auto zb = LayoutScheduleTable(job, l, 8);
  ASSERT_TRUE(zb.ok()) << zb.status();
  EXPECT_TRUE(SplitsBackward(*zb));
  EXPECT_EQ(RowsOfRank(*zb, 3).size(), 3u * 8);
  // A file table must have the layout's shape.
  l.schedule = PipelineSchedule::kFile;
  EXPECT_FALSE(LayoutScheduleTable(job, l, 8).ok());
  job.schedule_table =
      std::make_shared<const pipeline::ScheduleTable>(*expected);
  EXPECT_TRUE(LayoutScheduleTable(job, l, 8).ok());
  auto wrong = LayoutScheduleTable(job, l, 4);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("not 4 x 1 x 4"), std::string::npos)
      << wrong.status();
}

// With unit-time operations the simulated step is the schedules' stated
// bubble: 1F1B (m + P - 1)(F + B), ZB-H1 with F = B = W: 3m + P - 1.
TEST(ScheduleWalkTest, UnitTimesGiveTheTheoreticalBubble) {
  for (int P : {2, 4}) {
    for (int m : {P, 2 * P, 4 * P}) {
      auto one = pipeline::GenerateScheduleTable(
          pipeline::ScheduleKind::kOneFOneB, {P, 1, m});
      ASSERT_TRUE(one.ok());
      auto t = SimulateStepSeconds(
          *one, [](const ScheduleRow& r) { return UnitTimes(r, 1, 2, 0); });
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_DOUBLE_EQ(*t, (m + P - 1) * 3.0) << P << " " << m;
      auto zb = pipeline::GenerateScheduleTable(
          pipeline::ScheduleKind::kZeroBubbleH1, {P, 1, m});
      ASSERT_TRUE(zb.ok());
      t = SimulateStepSeconds(
          *zb, [](const ScheduleRow& r) { return UnitTimes(r, 1, 1, 1); });
      ASSERT_TRUE(t.ok()) << t.status();
      const double bubble = (*t - 3.0 * m) / *t;
      EXPECT_NEAR(bubble,
                  pipeline::TheoreticalBubble(
                      pipeline::ScheduleKind::kZeroBubbleH1, P, 1, m),
                  1e-12)
          << P << " " << m;
    }
  }
}

// Interleaving's simulated fill and drain: (P - 1) (F + B) / chunks.
TEST(ScheduleWalkTest, InterleavedBubble) {
  auto t = pipeline::GenerateScheduleTable(pipeline::ScheduleKind::kInterleaved,
                                           {2, 2, 4});
  ASSERT_TRUE(t.ok());
  auto s = SimulateStepSeconds(
      *t, [](const ScheduleRow& r) { return UnitTimes(r, 0.5, 1, 0); });
  ASSERT_TRUE(s.ok()) << s.status();
  // Busy: 4 micro-batches x 2 chunks x 1.5; idle (2 - 1) x 3 / 2.
  EXPECT_DOUBLE_EQ(*s, 12 + 1.5);
}

// ZB-V: the layout's table is the executor's V-shaped one (chunk 1 of the
// last rank follows its chunk 0; rank 0 holds the first and the last
// virtual stage), and with unit F = B = W its simulated bubble is the
// schedule's stated one, below ZB-H1's.
TEST(ScheduleWalkTest, ZeroBubbleVWalksTheVShapedTable) {
  JobSpec job;
  Layout l;
  l.pp = 4;
  l.virtual_stages = 2;
  l.schedule = PipelineSchedule::kZeroBubbleV;
  auto v = LayoutScheduleTable(job, l, 8);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->shape.v_shape);
  EXPECT_TRUE(SplitsBackward(*v));
  EXPECT_TRUE(LayoutSplitsBackward(job, l));
  EXPECT_EQ(VirtualStageOf(v->shape, 0, 0), 0);
  EXPECT_EQ(VirtualStageOf(v->shape, 0, 1), 7);
  EXPECT_EQ(VirtualStageOf(v->shape, 3, 0), 3);
  EXPECT_EQ(VirtualStageOf(v->shape, 3, 1), 4);
  for (int P : {2, 4}) {
    for (int m : {2 * P, 4 * P}) {
      auto t = pipeline::GenerateScheduleTable(
          pipeline::ScheduleKind::kZeroBubbleV, {P, 2, m});
      ASSERT_TRUE(t.ok()) << t.status();
      // Each chunk is half a stage: F = B = W = 1/2.
      auto s = SimulateStepSeconds(
          *t, [](const ScheduleRow& r) { return UnitTimes(r, 0.5, 0.5, 0.5); });
      ASSERT_TRUE(s.ok()) << s.status();
      const double bubble = (*s - 3.0 * m) / *s;
      EXPECT_NEAR(bubble,
                  pipeline::TheoreticalBubble(
                      pipeline::ScheduleKind::kZeroBubbleV, P, 2, m),
                  1e-12)
          << P << " " << m;
      EXPECT_LT(bubble, pipeline::TheoreticalBubble(
                            pipeline::ScheduleKind::kZeroBubbleH1, P, 1, m));
    }
  }
}

TEST(ScheduleWalkTest, AStalledTableIsNamed) {
  pipeline::ScheduleTable t;
  t.shape = {2, 1, 1};
  // Rank 0 waits for B on stage 1 first: rank 1 never gets its F input.
  t.rows = {{0, 0, 0, 0, ScheduleOp::kBackward},
            {0, 1, 0, 0, ScheduleOp::kForward},
            {1, 0, 0, 0, ScheduleOp::kForward},
            {1, 1, 0, 0, ScheduleOp::kBackward}};
  auto s = SimulateStepSeconds(t, [](const ScheduleRow&) { return 1.0; });
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("rank 0 step 0"), std::string::npos)
      << s.status();
}

}  // namespace
}  // namespace planner
}  // namespace mcc
