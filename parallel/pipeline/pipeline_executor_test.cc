// The executor's checks of the chunks it is given, through a model that is
// not the GPT (parallel/testing/mlp_stack.h), in one process.
#include "parallel/pipeline/pipeline_executor.h"

#include <memory>
#include <vector>

#include "core/ops/loss_totals.h"
#include "gtest/gtest.h"
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

}  // namespace
}  // namespace pipeline
}  // namespace mcc
