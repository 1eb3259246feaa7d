#include "planner/layout.h"

#include "gtest/gtest.h"

namespace mcc {
namespace planner {
namespace {

TEST(LayoutTest, NameRoundTrips) {
  Layout l;
  l.tp = 2;
  l.sequence_parallel = true;
  l.pp = 4;
  l.virtual_stages = 2;
  l.dp = 8;
  l.cp = 2;
  l.zero = ZeroStage::kOptimizer;
  l.recompute = Recompute::kSelective;
  l.micro_batch = 3;
  EXPECT_EQ(l.Name(), "tp2sp.pp4v2.dp8.cp2.z1.rselective.mb3");
  auto back = ParseLayout(l.Name());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Name(), l.Name());
  EXPECT_EQ(back->world(), 2 * 4 * 8 * 2);
}

TEST(LayoutTest, PartsMayBeLeftOutOrReordered) {
  auto l = ParseLayout("dp4.tp2.z3.mb2");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->Name(), "tp2.pp1.dp4.cp1.z3.rnone.mb2");
  // Sequence parallelism means nothing at TP 1.
  EXPECT_FALSE(ParseLayout("tp1sp")->sequence_parallel);
  // torchtitan's op-level checkpointing, modelled for comparison.
  auto ops = ParseLayout("dp8.z3.rops.mb2");
  ASSERT_TRUE(ops.ok()) << ops.status();
  EXPECT_EQ(ops->recompute, Recompute::kSelectiveOps);
  EXPECT_EQ(ops->Name(), "tp1.pp1.dp8.cp1.z3.rops.mb2");
}

// Expert parallelism shows only when set: dense layouts keep their names.
TEST(LayoutTest, ExpertPartsRoundTrip) {
  auto l = ParseLayout("tp2.dp4.ep4.etp1.mb2");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->ep, 4);
  EXPECT_EQ(l->etp, 1);
  EXPECT_EQ(l->Name(), "tp2.pp1.dp4.cp1.z0.rnone.mb2.ep4.etp1");
  EXPECT_EQ(ParseLayout(l->Name())->Name(), l->Name());
  auto dense = ParseLayout("dp4");
  EXPECT_EQ(dense->ep, 1);
  EXPECT_EQ(dense->etp, 0);
  EXPECT_EQ(dense->Name(), "tp1.pp1.dp4.cp1.z0.rnone.mb1");
}

TEST(LayoutTest, ScheduleInstancesAndOffloadRoundTrip) {
  auto l = ParseLayout("pp2.dp4.z1.mb2.szb-h1.i2.o50");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->schedule, PipelineSchedule::kZeroBubbleH1);
  EXPECT_EQ(l->instances, 2);
  EXPECT_EQ(l->offload_percent, 50);
  EXPECT_EQ(l->Name(), "tp1.pp2.dp4.cp1.z1.rnone.mb2.szb-h1.i2.o50");
  auto v = ParseLayout("pp2v2.szbv");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->schedule, PipelineSchedule::kZeroBubbleV);
  EXPECT_EQ(v->Name(), "tp1.pp2v2.dp1.cp1.z0.rnone.mb1.szbv");
  // The defaults add nothing to the name.
  EXPECT_EQ(ParseLayout("pp2.s1f1b.i1")->Name(),
            "tp1.pp2.dp1.cp1.z0.rnone.mb1");
}

TEST(LayoutTest, StageLayerCountsRoundTrip) {
  auto l = ParseLayout("last3.pp4.first1.szb-h1");
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->first_stage_layers, 1);
  EXPECT_EQ(l->last_stage_layers, 3);
  EXPECT_EQ(l->Name(), "tp1.pp4.dp1.cp1.z0.rnone.mb1.szb-h1.first1.last3");
  EXPECT_EQ(ParseLayout("pp2.last5")->Name(),
            "tp1.pp2.dp1.cp1.z0.rnone.mb1.last5");
}

TEST(LayoutTest, BadPartsAreNamed) {
  for (const char* bad : {"tp0", "z4", "pp2v", "mbx", "rsome", "foo", "ep0",
                          "etpx", "szbv2", "i0", "o101", "first0", "lastx"}) {
    auto l = ParseLayout(bad);
    ASSERT_FALSE(l.ok()) << bad;
    EXPECT_NE(l.status().message().find(bad), std::string::npos) << l.status();
  }
}

}  // namespace
}  // namespace planner
}  // namespace mcc
