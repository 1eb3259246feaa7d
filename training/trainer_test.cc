// The trainer against a training step written out by hand, and its failure
// paths.
#include "training/trainer.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/expert_weight_packing.h"
#include "core/ops/grouped_gemm.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/testing/mlp_stack.h"

namespace mcc {
namespace training {
namespace {

constexpr int kSteps = 4;
constexpr int kMicroBatches = 3;  // Gradient accumulation.
constexpr double kClip = 0.05;    // Acts on every step here (norms ~0.3+).
constexpr double kWeightDecay = 0.01;
constexpr double kMomentum = 0.9;

gpt::GPTConfig Config() {
  gpt::GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.seq_length = 8;
  c.seed = 3;
  return c;
}

std::unique_ptr<gpt::GPTModel> NewModel(DType dtype = DType::kFloat32) {
  parallel::LayerContext ctx;
  ctx.dtype = dtype;
  ctx.seed = Config().seed;
  return *gpt::GPTModel::Create(Config(), ctx);
}

gpt::MicroBatch Batch(int step, int index) {
  const gpt::GPTConfig c = Config();
  std::mt19937 rng(500 + 31 * step + index);
  std::vector<int64_t> tokens(2 * c.seq_length), labels(tokens.size());
  for (auto& t : tokens) t = rng() % c.vocab_size;
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i] = i % 5 == 2 ? -100 : (tokens[i] * 5 + 1) % c.vocab_size;
  }
  gpt::MicroBatch b;
  b.tokens = *Tensor::FromInts(tokens, {2, c.seq_length});
  b.labels = *Tensor::FromInts(labels, {2, c.seq_length});
  return b;
}

std::vector<gpt::MicroBatch> Batches(int step) {
  std::vector<gpt::MicroBatch> batches;
  for (int i = 0; i < kMicroBatches; ++i) batches.push_back(Batch(step, i));
  return batches;
}

optim::OptimizerConfig SgdConfig() {
  optim::OptimizerConfig c;
  c.type = optim::OptimizerType::kSgd;
  c.sgd_momentum = kMomentum;
  c.weight_decay = kWeightDecay;
  c.clip_grad = kClip;
  return c;
}

optim::LrSchedule Schedule() {
  optim::LrScheduleConfig c;
  c.lr = 0.5;
  c.min_lr = 0.05;
  c.warmup_iters = 1;
  c.decay_iters = kSteps;
  c.decay_style = optim::LrDecayStyle::kLinear;
  return *optim::LrSchedule::Create(c);
}

// The step written out: gradient accumulation with 1/M per micro-batch,
// the global norm in fp64, clipping as Megatron's (coefficient clip / (norm
// + 1e-6) when below 1), SGD with momentum whose weight decay is added to
// the clipped gradient (as torch.optim.SGD's), on the fp32 weights.
struct ReferenceRun {
  std::vector<double> loss, grad_norm;
  std::vector<std::vector<float>> params;
};

ReferenceRun TrainByHand() {
  auto model = NewModel();
  const optim::LrSchedule schedule = Schedule();
  std::vector<std::vector<float>> momentum(model->parameters().size());
  ReferenceRun out;
  for (int step = 0; step < kSteps; ++step) {
    model->ZeroGradients();
    double loss = 0;
    for (const gpt::MicroBatch& b : Batches(step)) {
      auto l = model->ForwardBackward(b, 1.0f / kMicroBatches);
      EXPECT_TRUE(l.ok()) << l.status();
      loss += l->mean() / kMicroBatches;
    }
    double sq = 0;
    for (const auto& p : model->parameters()) {
      for (float g : p->main_grad.ToFloats()) sq += static_cast<double>(g) * g;
    }
    const double norm = std::sqrt(sq);
    const double coef = kClip / (norm + 1e-6);
    const float scale = coef < 1.0 ? static_cast<float>(coef) : 1.0f;
    const float lr = static_cast<float>(schedule.LearningRate(step + 1));
    for (size_t k = 0; k < model->parameters().size(); ++k) {
      Parameter& p = *model->parameters()[k];
      float* w = p.value.data<float>();
      const float* g = p.main_grad.data<float>();
      const float wd = p.weight_decay ? static_cast<float>(kWeightDecay) : 0.f;
      std::vector<float>& buf = momentum[k];
      if (buf.empty()) buf.assign(p.value.numel(), 0.f);
      for (int64_t i = 0; i < p.value.numel(); ++i) {
        const float d = g[i] * scale + wd * w[i];
        buf[i] = step == 0 ? d : static_cast<float>(kMomentum) * buf[i] + d;
        w[i] -= lr * buf[i];
      }
    }
    out.loss.push_back(loss);
    out.grad_norm.push_back(norm);
  }
  for (const auto& p : model->parameters()) {
    out.params.push_back(p->value.ToFloats());
  }
  return out;
}

// The largest |a - b| over every parameter element.
double MaxParamDiff(const std::vector<std::vector<float>>& a,
                    const ParameterList& b) {
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    const std::vector<float> v = b[k]->value.ToFloats();
    for (size_t i = 0; i < v.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(a[k][i]) - v[i]));
    }
  }
  return worst;
}

// How the trainer runs the micro-batches and keeps the gradients: its own
// single-stage executor or one given, gradients in the model, in a DDP or
// in ZeRO-3 shards.
enum class Path { kOwnExecutor, kExecutor, kNoShard, kZero3 };

std::string PathName(const ::testing::TestParamInfo<Path>& info) {
  switch (info.param) {
    case Path::kOwnExecutor:
      return "OwnExecutor";
    case Path::kExecutor:
      return "Executor";
    case Path::kNoShard:
      return "DdpNoShard";
    case Path::kZero3:
      return "Zero3";
  }
  return "";
}

class TrainerVersusHandWrittenStep : public ::testing::TestWithParam<Path> {};

// Error bound: the executor and no_shard paths do the same fp32
// operations in the same order as the hand-written step except the fp64 sum
// of squared gradients (the optimizer's kernel sums in blocks), which moves
// the clip coefficient by ~1e-15 relative. That is below fp32 rounding, but
// it can still flip the rounding of the fp32 gradient scale (clip x 1/loss
// scale) by one ulp, 6e-8 relative on every update of that step (seen under
// -O1 with AddressSanitizer, where the compiler contracts other products
// into FMAs); after 4 steps losses and norms stay under 1e-6 relative. ZeRO-3
// forms each micro-batch's gradient alone and adds it to the shard instead
// of accumulating inside the GEMMs: a few fp32 ulps per element and
// micro-batch, also under 1e-6 relative after 4 steps. Weights (|w| < 1, 4
// updates each well under 1) agree to a few fp32 ulps: 1e-6 absolute on
// every path.
TEST_P(TrainerVersusHandWrittenStep, LossesNormsAndWeightsAgree) {
  const ReferenceRun want = TrainByHand();
  const double rel = 1e-6;

  auto model = NewModel();
  std::unique_ptr<pipeline::PipelineExecutor> executor;
  std::unique_ptr<data_parallel::DataParallel> dp;
  std::unique_ptr<optim::Optimizer> optimizer;
  TrainerParts parts;
  parts.models = {model.get()};
  if (GetParam() == Path::kExecutor) {
    pipeline::PipelineOptions o;
    o.schedule = pipeline::ScheduleKind::kNoPipelining;
    executor = *pipeline::PipelineExecutor::Create({model.get()}, nullptr, o);
    parts.executor = executor.get();
  } else {
    parts.stages = {model.get()};
  }
  if (GetParam() == Path::kNoShard || GetParam() == Path::kZero3) {
    fsdp::FsdpConfig config;
    config.strategy = GetParam() == Path::kNoShard
                          ? fsdp::ShardingStrategy::kNoShard
                          : fsdp::ShardingStrategy::kOptimGradsParams;
    auto wrapped = WrapDataParallel(parts.models, nullptr, nullptr, config);
    ASSERT_TRUE(wrapped.ok()) << wrapped.status();
    dp = std::move(*wrapped);
    parts.data_parallel = dp.get();
    optimizer = *dp->CreateOptimizer(SgdConfig(), {});
  } else {
    optimizer = *optim::Optimizer::Create(model->parameters(), SgdConfig(), {});
  }
  parts.optimizer = optimizer.get();
  auto trainer = Trainer::Create(parts, Schedule());
  ASSERT_TRUE(trainer.ok()) << trainer.status();

  for (int step = 0; step < kSteps; ++step) {
    model->SetMicroBatches(
        std::make_shared<const std::vector<gpt::MicroBatch>>(Batches(step)));
    auto m = (*trainer)->Step(kMicroBatches, step + 1);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_NEAR(m->loss, want.loss[step], rel * want.loss[step]) << step;
    EXPECT_NEAR(m->grad_norm, want.grad_norm[step], rel * want.grad_norm[step])
        << step;
    EXPECT_LT(kClip, m->grad_norm) << "clipping must act on step " << step;
    EXPECT_FALSE(m->skipped);
    EXPECT_EQ(m->num_microbatches, kMicroBatches);
    EXPECT_DOUBLE_EQ(m->lr, Schedule().LearningRate(step + 1));
    EXPECT_GT(m->loss_tokens, 0);
  }
  ASSERT_TRUE((*trainer)->WaitForParameters().ok());
  if (dp != nullptr) {
    ASSERT_TRUE(dp->GatherFullParams().ok());
  }
  EXPECT_LT(MaxParamDiff(want.params, model->parameters()), 1e-6);
  // The weights moved: a trainer that did nothing would fail above, but
  // say so plainly.
  auto untrained = NewModel();
  EXPECT_GT(MaxParamDiff(want.params, untrained->parameters()), 1e-3);
  if (dp != nullptr) {
    ASSERT_TRUE(dp->ReleaseFullParams().ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, TrainerVersusHandWrittenStep,
                         ::testing::Values(Path::kOwnExecutor, Path::kExecutor,
                                           Path::kNoShard, Path::kZero3),
                         PathName);

// An MoE GPT trained with its experts' weights packed for each step's
// micro-batches (TrainerOptions::pack_expert_weights) against the same run
// unpacked. The packs are made from each step's weights and dropped before
// its optimizer step: packs kept across a step compute the later steps with
// stale weights and move their losses by 2e-4 to 4e-4 relative, 20-40
// times the bound (checked by keeping one scope alive across the steps; the
// idle-bytes check fails too). Packed fp32 GEMMs (brgemm) sum the same
// products as dnnl_sgemm in another order: a few fp32 ulps per GEMM, under
// 1e-5 relative in losses and norms and 1e-5 absolute in weights after 4
// steps.
TEST(TrainerMoe, PackedExpertWeightsTrainAsUnpacked) {
  struct Run {
    std::vector<double> loss, grad_norm;
    std::vector<std::vector<float>> params;
  };
  auto train = [](bool pack) {
    gpt::GPTConfig c = Config();
    c.num_experts = 4;
    c.add_bias_linear = false;
    parallel::LayerContext ctx;
    ctx.dtype = DType::kFloat32;
    ctx.seed = c.seed;
    auto model = *gpt::GPTModel::Create(c, ctx);
    auto optimizer =
        *optim::Optimizer::Create(model->parameters(), SgdConfig(), {});
    TrainerParts parts;
    parts.models = {model.get()};
    parts.stages = {model.get()};
    parts.optimizer = optimizer.get();
    TrainerOptions options;
    options.pack_expert_weights = pack;
    auto trainer = *Trainer::Create(parts, Schedule(), options);
    Run out;
    for (int step = 0; step < kSteps; ++step) {
      model->SetMicroBatches(
          std::make_shared<const std::vector<gpt::MicroBatch>>(Batches(step)));
      auto m = trainer->Step(kMicroBatches, step + 1);
      EXPECT_TRUE(m.ok()) << m.status();
      if (!m.ok()) return out;
      out.loss.push_back(m->loss);
      out.grad_norm.push_back(m->grad_norm);
    }
    EXPECT_TRUE(trainer->WaitForParameters().ok());
    for (const auto& p : model->parameters()) {
      out.params.push_back(p->value.ToFloats());
    }
    return out;
  };
  {
    // Whether this CPU packs at all (oneDNN's brgemm kernels).
    ops::ScopedExpertWeightPacking probe;
    Tensor x = *Tensor::FromVector(std::vector<float>(64, 0.5f), {4, 16});
    Tensor w = *Tensor::FromVector(std::vector<float>(256, 0.25f), {1, 16, 16});
    Tensor y = Tensor::Empty({4, 16}, DType::kFloat32);
    ASSERT_TRUE(ops::GroupedGemm(x, w, true, {4}, &y).ok());
    if (probe.packed_matrices() == 0) {
      GTEST_SKIP() << "no oneDNN brgemm kernel on this CPU: nothing packed";
    }
  }
  ops::FreeIdleExpertWeightPacks();
  const Run unpacked = train(false);
  EXPECT_EQ(ops::IdleExpertWeightPackBytes(), 0);
  const Run packed = train(true);
  // The packs were made, and went idle when the steps' scopes ended.
  EXPECT_GT(ops::IdleExpertWeightPackBytes(), 0);
  ASSERT_EQ(packed.loss.size(), unpacked.loss.size());
  for (size_t s = 0; s < packed.loss.size(); ++s) {
    EXPECT_NEAR(packed.loss[s], unpacked.loss[s], 1e-5 * unpacked.loss[s]) << s;
    EXPECT_NEAR(packed.grad_norm[s], unpacked.grad_norm[s],
                1e-5 * unpacked.grad_norm[s])
        << s;
  }
  double worst = 0;
  for (size_t k = 0; k < packed.params.size(); ++k) {
    for (size_t i = 0; i < packed.params[k].size(); ++i) {
      worst =
          std::max(worst, std::abs(static_cast<double>(packed.params[k][i]) -
                                   unpacked.params[k][i]));
    }
  }
  EXPECT_LT(worst, 1e-5);
}

TEST(TrainerEvaluate, IsTheTokenWeightedMeanOfTheForwardLosses) {
  auto model = NewModel();
  const std::vector<gpt::MicroBatch> batches = Batches(7);
  double sum = 0, tokens = 0;
  for (const gpt::MicroBatch& b : batches) {
    auto l = model->Forward(b);
    ASSERT_TRUE(l.ok()) << l.status();
    sum += l->sum;
    tokens += l->tokens;
  }
  pipeline::PipelineOptions o;
  o.schedule = pipeline::ScheduleKind::kNoPipelining;
  auto executor =
      *pipeline::PipelineExecutor::Create({model.get()}, nullptr, o);
  model->SetMicroBatches(
      std::make_shared<const std::vector<gpt::MicroBatch>>(batches));
  auto got = Evaluate(executor.get(), nullptr, kMicroBatches);
  ASSERT_TRUE(got.ok()) << got.status();
  // The same forwards, summed in the same order: 1e-12 relative.
  EXPECT_NEAR(got->sum, sum, 1e-12 * sum);
  EXPECT_DOUBLE_EQ(got->tokens, tokens);
  EXPECT_NEAR(got->loss, sum / tokens, 1e-12 * sum / tokens);
  // No micro-batches: no loss, no error.
  auto none = Evaluate(executor.get(), nullptr, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->loss, 0.0);
}

// fp16 with the dynamic loss scaler: an inf in a gradient skips the update
// (weights unchanged) and halves the scale (hysteresis 1); the next clean
// step trains at the lowered scale.
TEST(TrainerLossScaling, InfGradientSkipsTheStepAndLowersTheScale) {
  auto model = NewModel(DType::kFloat16);
  optim::OptimizerConfig config = SgdConfig();
  config.loss_scaling = true;
  config.loss_scaler.initial_scale = 1024;
  config.loss_scaler.hysteresis = 1;
  auto optimizer = *optim::Optimizer::Create(model->parameters(), config, {});
  TrainerParts parts;
  parts.models = {model.get()};
  parts.stages = {model.get()};
  parts.optimizer = optimizer.get();
  TrainerOptions options;
  options.before_optimizer_step = [&](int64_t iteration) {
    if (iteration == 1) {
      model->parameters()[1]->main_grad.data<float>()[0] = INFINITY;
    }
    return absl::OkStatus();
  };
  auto trainer = *Trainer::Create(parts, Schedule(), options);
  std::vector<std::vector<float>> before;
  for (const auto& p : model->parameters())
    before.push_back(p->value.ToFloats());

  model->SetMicroBatches(
      std::make_shared<const std::vector<gpt::MicroBatch>>(Batches(0)));
  auto first = trainer->Step(kMicroBatches, 1);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->skipped);
  EXPECT_EQ(first->loss_scale, 1024);
  EXPECT_TRUE(std::isfinite(first->loss));
  EXPECT_EQ(MaxParamDiff(before, model->parameters()), 0.0);
  EXPECT_EQ(optimizer->loss_scale(), 512);

  model->SetMicroBatches(
      std::make_shared<const std::vector<gpt::MicroBatch>>(Batches(1)));
  auto second = trainer->Step(kMicroBatches, 2);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->skipped);
  EXPECT_EQ(second->loss_scale, 512);
  EXPECT_TRUE(std::isfinite(second->grad_norm));
  EXPECT_GT(MaxParamDiff(before, model->parameters()), 0.0);
}

TEST(TrainerConfig, BadPartsFailWithAClearError) {
  auto a = NewModel(), b = NewModel();
  auto optimizer = *optim::Optimizer::Create(a->parameters(), SgdConfig(), {});
  TrainerParts parts;
  parts.optimizer = optimizer.get();

  auto none = Trainer::Create(parts, Schedule());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("no models"), absl::string_view::npos)
      << none.status();

  parts.models = {a.get(), b.get()};
  parts.stages = {a.get()};
  auto two = Trainer::Create(parts, Schedule());
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("as pipeline stages too"),
            absl::string_view::npos)
      << two.status();

  parts.models = {a.get()};
  parts.optimizer = nullptr;
  auto no_optimizer = Trainer::Create(parts, Schedule());
  ASSERT_FALSE(no_optimizer.ok());
  EXPECT_NE(no_optimizer.status().message().find("no optimizer"),
            absl::string_view::npos)
      << no_optimizer.status();

  parts.optimizer = optimizer.get();
  auto trainer = *Trainer::Create(parts, Schedule());
  auto empty = trainer->Step(0, 5);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find("iteration 5 has 0 micro-batches"),
            absl::string_view::npos)
      << empty.status();

  // More micro-batches than the model was given: the model's error, with
  // the executor's stage and micro-batch, comes back.
  a->SetMicroBatches(
      std::make_shared<const std::vector<gpt::MicroBatch>>(Batches(0)));
  auto beyond = trainer->Step(kMicroBatches + 1, 1);
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message().find(
                absl::StrCat("micro-batch ", kMicroBatches)),
            absl::string_view::npos)
      << beyond.status();
}

// One sharded wrapper serves several chunks: their units are numbered one
// after another, and every chunk's parameters are wrapped.
TEST(TrainerDataParallel, ShardedStrategiesWrapSeveralChunks) {
  auto a = NewModel(), b = NewModel();
  fsdp::FsdpConfig config;
  config.strategy = fsdp::ShardingStrategy::kOptimGrads;
  auto wrapped = WrapDataParallel({a.get(), b.get()}, nullptr, nullptr, config);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status();
  auto* sharded = dynamic_cast<fsdp::FullyShardedDataParallel*>(wrapped->get());
  ASSERT_NE(sharded, nullptr);
  EXPECT_EQ(sharded->num_units(),
            static_cast<int>(a->units().size() + b->units().size()));
  EXPECT_EQ((*wrapped)->parameters().size(),
            a->parameters().size() + b->parameters().size());
}

// The trainer on a model that is not the GPT (the contract's test MLP):
// gradients in the model, in a DDP and in ZeRO-3 shards give the same
// losses, and the loss falls. Bound: as for the GPT above, the DDP keeps
// the model's fp32 accumulation (1e-12 relative) and ZeRO-3 adds each
// micro-batch's gradient to its shard (a few fp32 ulps per step: 1e-6).
TEST(TrainerOnAnyModel, TrainsTheContractsTestMlp) {
  const parallel::testing::MlpStackConfig config;
  std::vector<std::vector<double>> losses;
  for (fsdp::ShardingStrategy strategy :
       {fsdp::ShardingStrategy::kNoShard, fsdp::ShardingStrategy::kNoShard,
        fsdp::ShardingStrategy::kOptimGradsParams}) {
    const bool wrap = !losses.empty();  // The first run has no DP wrapper.
    auto model = *parallel::testing::MlpStack::Create(
        config, parallel::LayerContext(), 0, config.num_blocks);
    TrainerParts parts;
    parts.models = {model.get()};
    parts.stages = {model.get()};
    std::unique_ptr<data_parallel::DataParallel> dp;
    std::unique_ptr<optim::Optimizer> optimizer;
    if (wrap) {
      fsdp::FsdpConfig c;
      c.strategy = strategy;
      dp = *WrapDataParallel(parts.models, nullptr, nullptr, c);
      parts.data_parallel = dp.get();
      optimizer = *dp->CreateOptimizer(SgdConfig(), {});
    } else {
      optimizer =
          *optim::Optimizer::Create(model->parameters(), SgdConfig(), {});
    }
    parts.optimizer = optimizer.get();
    auto trainer = *Trainer::Create(parts, Schedule());
    losses.emplace_back();
    for (int step = 0; step < kSteps; ++step) {
      auto batches =
          std::make_shared<std::vector<parallel::testing::MlpBatch>>();
      for (int i = 0; i < kMicroBatches; ++i) {
        batches->push_back(
            parallel::testing::MakeMlpBatch(config, step % 2, i));
      }
      model->SetMicroBatches(batches);
      auto m = trainer->Step(kMicroBatches, step + 1);
      ASSERT_TRUE(m.ok()) << m.status();
      losses.back().push_back(m->loss);
    }
  }
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(losses[1][step], losses[0][step], 1e-12 * losses[0][step]);
    EXPECT_NEAR(losses[2][step], losses[0][step], 1e-6 * losses[0][step]);
  }
  EXPECT_LT(losses[0][kSteps - 1], losses[0][0]);
}

}  // namespace
}  // namespace training
}  // namespace mcc
