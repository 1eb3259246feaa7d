// StageModel on a device that is not the host (the test device,
// core/testing/test_device.h) takes the data loader's host micro-batches
// and stages them through pinned buffers: one host-to-device copy per
// tensor, none back, and the forward gives the CPU model's losses bit for
// bit.
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "core/ops/loss_totals.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"
#include "models/gpt/stage_model.h"
#include "parallel/pipeline/pipeline_executor.h"

namespace mcc {
namespace gpt {
namespace {

constexpr int kMicroBatches = 3;

GPTConfig Config() {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.seq_length = 8;
  c.seed = 7;
  return c;
}

// Host micro-batches as the data loader makes them; the second is masked.
std::vector<MicroBatch> HostBatches(uint32_t seed) {
  const GPTConfig c = Config();
  std::vector<MicroBatch> out;
  for (int m = 0; m < kMicroBatches; ++m) {
    std::mt19937 rng(seed + m);
    std::vector<int64_t> tokens(2 * c.seq_length), labels(tokens.size());
    std::vector<float> mask(tokens.size());
    for (auto& t : tokens) t = rng() % c.vocab_size;
    for (size_t i = 0; i < labels.size(); ++i) {
      labels[i] = i % 5 == 2 ? -100 : static_cast<int64_t>(rng() % 64);
      mask[i] = (rng() % 4) / 3.0f;
    }
    MicroBatch b;
    b.tokens = *Tensor::FromInts(tokens, {2, c.seq_length});
    b.labels = *Tensor::FromInts(labels, {2, c.seq_length});
    if (m == 1) b.loss_mask = *Tensor::FromVector(mask, {2, c.seq_length});
    out.push_back(b);
  }
  return out;
}

std::unique_ptr<StageModel> Model(Device device) {
  parallel::LayerContext ctx;
  ctx.seed = Config().seed;
  ctx.device = device;
  pipeline::PipelineConfig split;
  split.num_layers = Config().num_layers;
  return *StageModel::Create(Config(), ctx, split, 0);
}

// Each micro-batch's loss sum and the totals, as host floats.
std::vector<std::vector<float>> ForwardLosses(StageModel* model) {
  pipeline::PipelineOptions one_stage;
  one_stage.schedule = pipeline::ScheduleKind::kNoPipelining;
  auto executor =
      *pipeline::PipelineExecutor::Create(model->stages(), nullptr, one_stage);
  auto run = executor->Run(kMicroBatches, 0.0f, /*forward_only=*/true);
  EXPECT_TRUE(run.ok()) << run.status();
  std::vector<std::vector<float>> out;
  if (!run.ok()) return out;
  for (const Tensor& loss : run->microbatch_losses) {
    out.push_back(loss.To(Device::CPU())->ToFloats());
  }
  out.push_back(run->loss_totals.To(Device::CPU())->ToFloats());
  return out;
}

TEST(StageModelStagingTest,
     HostMicroBatchesReachTheDeviceThroughPinnedBuffers) {
  auto cpu = Model(Device::CPU());
  auto dev = Model(Device::TestDevice());
  for (uint32_t step = 0; step < 2; ++step) {
    const std::vector<MicroBatch> batches = HostBatches(100 * step);
    ASSERT_TRUE(cpu->SetMicroBatches(batches).ok());
    const int64_t up = testing::TestDeviceCopiesFromHost();
    const int64_t down = testing::TestDeviceCopiesToHost();
    ASSERT_TRUE(dev->SetMicroBatches(batches).ok());
    // Tokens and labels of each, and the one mask: one copy each.
    EXPECT_EQ(testing::TestDeviceCopiesFromHost() - up, 2 * kMicroBatches + 1);
    EXPECT_EQ(testing::TestDeviceCopiesToHost() - down, 0);
    const auto want = ForwardLosses(cpu.get());
    const auto got = ForwardLosses(dev.get());
    ASSERT_EQ(want.size(), kMicroBatches + 1u);
    EXPECT_EQ(got, want) << "step " << step;
    // A loss that means something: about log(vocab) per token.
    auto totals = ops::LossTotalsFromHost(want.back());
    ASSERT_TRUE(totals.ok());
    EXPECT_GT(totals->mean_of_means, 2.0);
  }
  // Micro-batches already on the device are not copied again.
  std::vector<MicroBatch> on_device = HostBatches(7);
  for (MicroBatch& b : on_device) {
    b.tokens = *b.tokens.To(Device::TestDevice());
    b.labels = *b.labels.To(Device::TestDevice());
    if (b.loss_mask.defined()) {
      b.loss_mask = *b.loss_mask.To(Device::TestDevice());
    }
  }
  const int64_t up = testing::TestDeviceCopiesFromHost();
  ASSERT_TRUE(dev->SetMicroBatches(on_device).ok());
  EXPECT_EQ(testing::TestDeviceCopiesFromHost(), up);
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
