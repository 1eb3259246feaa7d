// The executor's checks of the chunks it is given, through a model that is
// not the GPT (parallel/testing/mlp_stack.h), in one process.
#include "parallel/pipeline/pipeline_executor.h"

#include <memory>
#include <vector>

#include "core/ops/loss_totals.h"
#include "gtest/gtest.h"
#include "parallel/pipeline/schedule_csv.h"
#include "parallel/testing/mlp_stack.h"

namespace mcc {
namespace pipeline {
namespace {

using parallel::testing::MakeMlpBatch;
using parallel::testing::MlpBatch;
using parallel::testing::MlpStack;
using parallel::testing::MlpStackConfig;

std::unique_ptr<MlpStack> Stack(int first, int count) {
  auto s = MlpStack::Create(MlpStackConfig(), parallel::LayerContext(), first,
                            count);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(PipelineExecutorTest, OneStageMustTakeTheInputAndComputeTheLoss) {
  auto tail = Stack(2, 2);  // Blocks 2 and 3: no batch input.
  auto head = Stack(0, 2);  // Blocks 0 and 1: no loss.
  auto e = PipelineExecutor::Create({tail.get()}, nullptr, {});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("batch input"), absl::string_view::npos)
      << e.status();
  e = PipelineExecutor::Create({head.get()}, nullptr, {});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("loss"), absl::string_view::npos)
      << e.status();
  e = PipelineExecutor::Create({nullptr}, nullptr, {});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PipelineExecutorTest, AMissingMicroBatchIsNamed) {
  auto model = Stack(0, MlpStackConfig().num_blocks);
  auto e = PipelineExecutor::Create({model.get()}, nullptr, {});
  ASSERT_TRUE(e.ok()) << e.status();
  auto batches = std::make_shared<std::vector<MlpBatch>>();
  batches->push_back(MakeMlpBatch(MlpStackConfig(), 0, 0));
  batches->push_back(MakeMlpBatch(MlpStackConfig(), 0, 1));
  model->SetMicroBatches(batches);
  auto run = (*e)->Run(3, 1.0f);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(run.status().message().find("micro-batch 2"),
            absl::string_view::npos)
      << run.status();
}

TEST(PipelineExecutorTest, OneStageRunEqualsTheChunksOwnSteps) {
  // The executor adds nothing to a single stage's arithmetic: its losses
  // and gradients are the chunk's ForwardStep / BackwardStep ones, bit for
  // bit.
  auto a = Stack(0, MlpStackConfig().num_blocks);
  auto b = Stack(0, MlpStackConfig().num_blocks);
  auto batches = std::make_shared<std::vector<MlpBatch>>();
  for (int i = 0; i < 3; ++i) {
    batches->push_back(MakeMlpBatch(MlpStackConfig(), 0, i));
  }
  a->SetMicroBatches(batches);
  b->SetMicroBatches(batches);
  auto e = PipelineExecutor::Create({a.get()}, nullptr, {});
  ASSERT_TRUE(e.ok()) << e.status();
  auto run = (*e)->Run(3, 0.5f);
  ASSERT_TRUE(run.ok()) << run.status();
  double mean_of_means = 0, sum = 0, tokens = 0;
  for (int i = 0; i < 3; ++i) {
    auto out = b->ForwardStep(i, Tensor(), /*backward_after=*/true);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(run->microbatch_losses.size(), 3u);
    EXPECT_EQ(run->microbatch_losses[i].ToFloats(), out->loss_sum.ToFloats())
        << i;
    auto loss = parallel::ReadLossSum(out->loss_sum);
    ASSERT_TRUE(loss.ok()) << loss.status();
    mean_of_means += loss->mean() / 3;
    sum += loss->sum;
    tokens += loss->tokens;
    ASSERT_TRUE(b->BackwardStep(Tensor(), 0.5f, std::move(out->record)).ok());
  }
  for (size_t p = 0; p < a->parameters().size(); ++p) {
    EXPECT_EQ(a->parameters()[p]->main_grad.ToFloats(),
              b->parameters()[p]->main_grad.ToFloats())
        << a->parameters()[p]->name;
  }
  // The step's totals: the host loop's float64 values, bit for bit.
  auto totals = ops::LossTotalsFromHost(run->loss_totals.ToFloats());
  ASSERT_TRUE(totals.ok()) << totals.status();
  EXPECT_EQ(totals->mean_of_means, mean_of_means);
  EXPECT_EQ(totals->sum, sum);
  EXPECT_EQ(totals->tokens, tokens);
  EXPECT_GT(sum, 0);
}

std::shared_ptr<std::vector<MlpBatch>> Batches(int n) {
  auto batches = std::make_shared<std::vector<MlpBatch>>();
  for (int i = 0; i < n; ++i) {
    batches->push_back(MakeMlpBatch(MlpStackConfig(), 0, i));
  }
  return batches;
}

// Runs one step of `options` over a fresh whole stack; its gradients.
absl::StatusOr<std::vector<std::vector<float>>> StepGradients(
    PipelineOptions options, int m, PipelineStats* stats = nullptr) {
  auto model = Stack(0, MlpStackConfig().num_blocks);
  model->SetMicroBatches(Batches(m));
  auto e = PipelineExecutor::Create({model.get()}, nullptr, options);
  if (!e.ok()) return e.status();
  auto run = (*e)->Run(m, 0.5f);
  if (!run.ok()) return run.status();
  if (stats != nullptr) *stats = run->stats;
  std::vector<std::vector<float>> grads;
  for (const auto& p : model->parameters()) {
    grads.push_back(p->main_grad.ToFloats());
  }
  return grads;
}

absl::StatusOr<std::shared_ptr<const ScheduleTable>> Table(
    const std::string& csv, int m) {
  auto table = ReadScheduleCsv(csv, {1, 1, m});
  if (!table.ok()) return table.status();
  return std::make_shared<const ScheduleTable>(*std::move(table));
}

TEST(PipelineExecutorTest, SplitBackwardEqualsTheWholeBackwardBitForBit) {
  // ZB-H1 on one stage runs F B W per micro-batch; a table defers every W
  // to the end. Both leave 1F1B's gradients bit for bit: each parameter's
  // contributions add in the same order.
  auto plain = StepGradients({}, 3);
  ASSERT_TRUE(plain.ok()) << plain.status();
  PipelineOptions zb;
  zb.schedule = ScheduleKind::kZeroBubbleH1;
  PipelineStats stats;
  auto split = StepGradients(zb, 3, &stats);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ(*split, *plain);
  EXPECT_GT(stats.weight_seconds, 0);
  EXPECT_EQ(stats.max_in_flight, 1);

  auto table = Table(
      "rank,step,microbatch,chunk,op\n"
      "0,0,0,0,F\n0,1,0,0,B\n0,2,1,0,F\n0,3,1,0,B\n0,4,2,0,F\n0,5,2,0,B\n"
      "0,6,0,0,W\n0,7,1,0,W\n0,8,2,0,W\n",
      3);
  ASSERT_TRUE(table.ok()) << table.status();
  PipelineOptions from_file;
  from_file.table = *table;
  from_file.table_max_held = 3;
  auto deferred = StepGradients(from_file, 3, &stats);
  ASSERT_TRUE(deferred.ok()) << deferred.status();
  EXPECT_EQ(*deferred, *plain);
  EXPECT_EQ(stats.max_in_flight, 3);  // Held until W.
}

TEST(PipelineExecutorTest, ATableThatCannotRunIsRefusedBeforeTheStep) {
  PipelineOptions options;
  // B of micro-batch 1 before its F.
  auto table = Table(
      "rank,step,microbatch,chunk,op\n"
      "0,0,0,0,F\n0,1,1,0,B\n0,2,1,0,F\n0,3,0,0,B\n",
      2);
  ASSERT_TRUE(table.ok()) << table.status();
  options.table = *table;
  auto run = StepGradients(options, 2);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(run.status().message().find("B micro-batch 1"),
            absl::string_view::npos)
      << run.status();
  // Another micro-batch count than the table's.
  run = StepGradients(options, 3);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(run.status().message().find("2 micro-batches"),
            absl::string_view::npos)
      << run.status();
  // Micro-batch 0's W after micro-batch 1's: data parallelism would have
  // reduced already.
  table = Table(
      "rank,step,microbatch,chunk,op\n"
      "0,0,0,0,F\n0,1,0,0,B\n0,2,1,0,F\n0,3,1,0,B\n0,4,1,0,W\n0,5,0,0,W\n",
      2);
  ASSERT_TRUE(table.ok()) << table.status();
  options.table = *table;
  options.table_max_held = 2;
  run = StepGradients(options, 2);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(run.status().message().find("last gradient step"),
            absl::string_view::npos)
      << run.status();
  // More held activations than 1F1B's (one on one stage).
  table = Table(
      "rank,step,microbatch,chunk,op\n"
      "0,0,0,0,F\n0,1,1,0,F\n0,2,0,0,B\n0,3,1,0,B\n",
      2);
  ASSERT_TRUE(table.ok()) << table.status();
  options.table = *table;
  options.table_max_held = 0;
  run = StepGradients(options, 2);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(run.status().message().find("holds 2"), absl::string_view::npos)
      << run.status();
}

}  // namespace
}  // namespace pipeline
}  // namespace mcc
