#include "planner/stage_balance.h"

#include "gtest/gtest.h"

namespace mcc {
namespace planner {
namespace {

JobSpec Job(int layers) {
  JobSpec job;
  job.model.num_layers = layers;
  return job;
}

StepTime Times(double layer, double head, double embedding) {
  StepTime t;
  t.layer_mb = layer;
  t.head_mb = head;
  t.embedding_mb = embedding;
  return t;
}

Layout Pp(int pp) {
  Layout l;
  l.pp = pp;
  return l;
}

TEST(StageBalanceTest, EvenSplitCarriesTheHeadOnTheLastStage) {
  const StageSplit even = EvenStageSplit(Job(8), Pp(2), Times(1, 1.5, 0.1));
  ASSERT_EQ(even.layers, (std::vector<int>{4, 4}));
  EXPECT_DOUBLE_EQ(even.seconds[0], 4.1);
  EXPECT_DOUBLE_EQ(even.seconds[1], 5.5);
  EXPECT_DOUBLE_EQ(even.bottleneck(), 5.5);
  // 16 micro-batches: the last stage runs 16, the first's one micro-batch
  // fills and drains around them.
  EXPECT_DOUBLE_EQ(even.step_seconds(16), 16 * 5.5 + 4.1);
  EXPECT_NEAR(even.idle_share(1, 16), 4.1 / (16 * 5.5 + 4.1), 1e-15);
  EXPECT_NEAR(even.idle_share(0, 16), 1 - 16 * 4.1 / (16 * 5.5 + 4.1), 1e-15);
  // Equal stages idle (p - 1) / (m + p - 1).
  const StageSplit equal = EvenStageSplit(Job(8), Pp(2), Times(1, 0, 0));
  EXPECT_NEAR(equal.idle_share(0, 16), 1.0 / 17, 1e-15);
}

// The balanced split is the best of every split the flags can express,
// found here by brute force over the stage counts directly.
TEST(StageBalanceTest, BalancedSplitIsTheBestTheFlagsCanExpress) {
  for (int pp : {2, 3, 4}) {
    for (int layers : {8, 12, 24}) {
      for (double head : {0.0, 0.5, 1.5, 3.0, 6.0}) {
        const StepTime t = Times(1, head, 0.2);
        const StageSplit best = BalancedStageSplit(Job(layers), Pp(pp), t);
        ASSERT_EQ(static_cast<int>(best.layers.size()), pp);
        int sum = 0;
        for (int n : best.layers) sum += n;
        EXPECT_EQ(sum, layers);
        // Every (first, last) with the middle stages equal and >= 1.
        double brute = 1e300;
        for (int first = 1; first < layers; ++first) {
          for (int last = 1; first + last <= layers; ++last) {
            const int rest = layers - first - last;
            const int middle = pp - 2;
            if (middle == 0 ? rest != 0 : (rest % middle != 0 || rest < middle))
              continue;
            double worst = std::max(first + 0.2, last + head);
            if (middle > 0) worst = std::max(worst, double(rest / middle));
            brute = std::min(brute, worst);
          }
        }
        EXPECT_NEAR(best.bottleneck(), brute, 1e-12)
            << "pp " << pp << " layers " << layers << " head " << head;
      }
    }
  }
}

TEST(StageBalanceTest, AHeavyHeadMovesLayersOffTheLastStage) {
  // 8 layers on 2 stages, the head worth 2 layers: 5 + 3 balances it.
  const StageSplit best = BalancedStageSplit(Job(8), Pp(2), Times(1, 2, 0));
  EXPECT_EQ(best.layers, (std::vector<int>{5, 3}));
  EXPECT_DOUBLE_EQ(best.bottleneck(), 5);
  // One flag says it (the other stage takes the rest).
  EXPECT_TRUE(best.Flags() == "--decoder-first-pipeline-num-layers 5" ||
              best.Flags() == "--decoder-last-pipeline-num-layers 3")
      << best.Flags();
  // No head: the even split stays, with no flags.
  const StageSplit even = BalancedStageSplit(Job(8), Pp(2), Times(1, 0, 0));
  EXPECT_EQ(even.layers, (std::vector<int>{4, 4}));
  EXPECT_EQ(even.first_stage_layers, 0);
  EXPECT_EQ(even.last_stage_layers, 0);
}

TEST(StageBalanceTest, InterleavedLayoutsKeepTheEvenSplit) {
  Layout l = Pp(2);
  l.virtual_stages = 2;
  const StageSplit best = BalancedStageSplit(Job(8), l, Times(1, 2, 0));
  EXPECT_EQ(best.first_stage_layers, 0);
  EXPECT_EQ(best.last_stage_layers, 0);
}

TEST(StageBalanceTest, ZeroBubbleVBalancesStageZerosHeadAndEmbedding) {
  // ZB-V's V turns back to stage 0: the output layer is there beside the
  // embedding. 12 layers, PP 2, the head worth 4 layers: the even 6 | 6
  // gives stage 0 10 layers' time; 4 | 8 (both even, halved over the
  // chunks) gives 8 | 8.
  Layout l = Pp(2);
  l.schedule = PipelineSchedule::kZeroBubbleV;
  l.virtual_stages = 2;
  const StepTime t = Times(1, 4, 0);
  const StageSplit even = EvenStageSplit(Job(12), l, t);
  EXPECT_EQ(even.layers, (std::vector<int>{6, 6}));
  EXPECT_DOUBLE_EQ(even.seconds[0], 10);
  EXPECT_DOUBLE_EQ(even.seconds[1], 6);
  const StageSplit best = BalancedStageSplit(Job(12), l, t);
  EXPECT_EQ(best.layers, (std::vector<int>{4, 8}));
  EXPECT_DOUBLE_EQ(best.bottleneck(), 8);
  EXPECT_TRUE(best.Flags() == "--decoder-first-pipeline-num-layers 4" ||
              best.Flags() == "--decoder-last-pipeline-num-layers 8")
      << best.Flags();
  // Every count it picks is even (halved over the two chunks).
  const StageSplit odd = BalancedStageSplit(Job(12), l, Times(1, 3, 0));
  EXPECT_EQ(odd.layers[0] % 2, 0);
  EXPECT_EQ(odd.layers[1] % 2, 0);
}

// The balanced split's step is quoted under the layout's own schedule:
// ZB-H1's walked table with equal stages and F = B = W idles the
// zero-bubble paper's (P - 1) / (3m + P - 1), below 1F1B's
// (P - 1) / (m + P - 1), and an uneven split's ZB-H1 step is shorter than
// its 1F1B step.
TEST(StageBalanceTest, StepFollowsTheLayoutsSchedule) {
  JobSpec job = Job(8);
  job.global_batch = 8;  // 8 micro-batches of 1
  StepTime t = Times(1, 0, 0);
  t.layer_weight_mb = 1.0 / 3;  // W = a third, as F
  Layout l = Pp(2);
  l.micro_batch = 1;
  l.schedule = PipelineSchedule::kZeroBubbleH1;
  const StageSplit equal = EvenStageSplit(job, l, t);
  ASSERT_EQ(equal.weight_seconds, (std::vector<double>{4.0 / 3, 4.0 / 3}));
  std::string name;
  const double zb = ScheduleStepSeconds(job, l, equal, &name);
  EXPECT_EQ(name, "ZB-H1");
  EXPECT_NEAR(1 - 8 * 4 / zb, 1.0 / (3 * 8 + 1), 1e-12);
  Layout one_f_one_b = Pp(2);
  one_f_one_b.micro_batch = 1;
  EXPECT_DOUBLE_EQ(ScheduleStepSeconds(job, one_f_one_b, equal, &name),
                   equal.step_seconds(8));
  EXPECT_EQ(name, "1F1B");
  // A heavy head on the last stage: ZB-H1 still fills part of the drain.
  t.head_mb = 1.5;
  t.head_weight_mb = 0.5;
  const StageSplit uneven = EvenStageSplit(job, l, t);
  EXPECT_DOUBLE_EQ(uneven.weight_seconds[1], 4.0 / 3 + 0.5);
  EXPECT_LT(ScheduleStepSeconds(job, l, uneven), uneven.step_seconds(8));
  EXPECT_GE(ScheduleStepSeconds(job, l, uneven), 8 * uneven.bottleneck());
}

// ZB-V's step is its own table walked, not 1F1B's closed form: with equal
// stages (F = B = W) it idles far less than 1F1B's (P - 1) / (m + P - 1),
// and the output layer is charged to stage 0's second chunk (the last
// virtual stage), the embedding to its first.
TEST(StageBalanceTest, ZeroBubbleVWalksItsOwnTable) {
  JobSpec job = Job(8);
  job.global_batch = 8;  // 8 micro-batches of 1
  StepTime t = Times(1, 0, 0);
  t.layer_weight_mb = 1.0 / 3;
  Layout l = Pp(2);
  l.micro_batch = 1;
  l.schedule = PipelineSchedule::kZeroBubbleV;
  l.virtual_stages = 2;
  const StageSplit equal = EvenStageSplit(job, l, t);
  std::string name;
  const double zbv = ScheduleStepSeconds(job, l, equal, &name);
  EXPECT_EQ(name, "ZB-V");
  EXPECT_GE(zbv, 8 * equal.bottleneck() - 1e-9);
  // 1F1B's formula: 8 x 4 + 4 = 36, idling 1 / 9.
  ASSERT_DOUBLE_EQ(equal.step_seconds(8), 36);
  EXPECT_LT(1 - 8 * 4 / zbv, 0.5 / 9) << zbv;
  // A heavy head: stage 0 runs 1 + 1 layers and the head, on its second
  // chunk.
  t.head_mb = 3;
  t.head_weight_mb = 1;
  t.embedding_mb = 0.5;
  const StageSplit heavy = EvenStageSplit(job, l, t);
  ASSERT_EQ(heavy.chunks.total.size(), 2u);
  EXPECT_DOUBLE_EQ(heavy.chunks.total[0][0], 2 + 0.5);
  EXPECT_DOUBLE_EQ(heavy.chunks.total[0][1], 2 + 3);
  EXPECT_DOUBLE_EQ(heavy.chunks.total[1][0], 2);
  EXPECT_DOUBLE_EQ(heavy.chunks.weight[0][1], 2.0 / 3 + 1);
  const double step = ScheduleStepSeconds(job, l, heavy);
  EXPECT_GE(step, 8 * heavy.bottleneck() - 1e-9);
  EXPECT_LT(step, heavy.step_seconds(8));
  // The head spread over both chunks (the stage's time halved) walks to a
  // different step.
  StageSplit spread = heavy;
  spread.chunks = ChunkSeconds();
  EXPECT_NE(ScheduleStepSeconds(job, l, spread), step);
}

}  // namespace
}  // namespace planner
}  // namespace mcc
