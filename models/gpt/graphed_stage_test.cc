// --cuda-graph (models/gpt/graphed_stage.h) on the test device, whose graph
// capture records kernels instead of running them (as CUDA does): the GPT
// trained through the trainer with its micro-batches captured once and
// replayed gives the eager run's losses, gradient norms, loss scales, final
// weights and optimizer state (whose moments carry the gradients) bit for
// bit, serial and over DP 2 (gradients reduced outside the graphs), in fp32
// and in fp16 (the dynamic loss scaler changes grad_scale, which re-runs a
// micro-batch eagerly and captures again). Planted faults fail: replays
// that do not copy the new micro-batch in give other losses, and a hook
// that reads the device inside the capture stops training with an error
// naming --cuda-graph.
#include "models/gpt/graphed_stage.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/stage_model.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline/layer_split.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/testing/device_parity.h"
#include "training/trainer.h"

namespace mcc {
namespace gpt {
namespace {

constexpr int kSteps = 3;
constexpr int kGlobalMicrobatches = 4;
constexpr int64_t kBatch = 2;

GPTConfig Config() {
  GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.seq_length = 8;
  c.seed = 11;
  return c;  // No dropout: --cuda-graph refuses it.
}

// Global micro-batch `index` of step `step`, on `device`: every one with a
// loss mask, except the last step's last, which the graphs do not fit (it
// runs eagerly).
absl::StatusOr<MicroBatch> Batch(const GPTConfig& c, int step, int index,
                                 Device device) {
  std::mt19937 rng(700 + 37 * step + index);
  std::vector<int64_t> tokens(kBatch * c.seq_length), labels(tokens.size());
  std::vector<float> mask(tokens.size());
  for (auto& t : tokens) t = rng() % c.vocab_size;
  for (size_t i = 0; i < labels.size(); ++i) {
    labels[i] = i % 5 == 2 ? -100 : (tokens[i] * 3 + 1) % c.vocab_size;
    mask[i] = (rng() % 4) / 3.0f;
  }
  MicroBatch b;
  MCC_ASSIGN_OR_RETURN(Tensor t,
                       Tensor::FromInts(tokens, {kBatch, c.seq_length}));
  MCC_ASSIGN_OR_RETURN(Tensor l,
                       Tensor::FromInts(labels, {kBatch, c.seq_length}));
  MCC_ASSIGN_OR_RETURN(b.tokens, t.To(device));
  MCC_ASSIGN_OR_RETURN(b.labels, l.To(device));
  if (!(step == kSteps - 1 && index == kGlobalMicrobatches - 1)) {
    MCC_ASSIGN_OR_RETURN(Tensor m,
                         Tensor::FromVector(mask, {kBatch, c.seq_length}));
    MCC_ASSIGN_OR_RETURN(b.loss_mask, m.To(device));
  }
  return b;
}

using parallel::testing::Bits;
using parallel::testing::BitsLine;
using parallel::testing::InitParityJob;
using parallel::testing::ReadLines;
using parallel::testing::TmpPath;
using parallel::testing::WriteLines;

// Modes: "eager", "graph", "graph_nocopy" (replays without copying the
// inputs in), "graph_hostread" (a grad-ready hook reads a gradient to the
// host, inside the captured backward).
absl::StatusOr<std::vector<std::string>> Train(parallel::ParallelState* state,
                                               const std::string& mode,
                                               DType dtype) {
  const Device device = Device::TestDevice(0);
  const GPTConfig config = Config();
  comm::ProcessGroup* dp = state->data();
  parallel::LayerContext ctx;
  ctx.dtype = dtype;
  ctx.seed = config.seed;
  ctx.device = device;
  pipeline::PipelineConfig split;
  split.num_layers = config.num_layers;
  MCC_ASSIGN_OR_RETURN(auto model, StageModel::Create(config, ctx, split, 0));
  GPTModel* chunk = model->chunk(0);
  const bool graphed = mode != "eager";
  std::unique_ptr<GraphedStage> graph_stage;
  std::vector<parallel::PipelineStage*> stages = model->stages();
  if (graphed) {
    GraphedStageOptions options;
    options.testing_skip_input_copy = mode == "graph_nocopy";
    MCC_ASSIGN_OR_RETURN(graph_stage, GraphedStage::Create(chunk, options));
    stages = {graph_stage.get()};
  }
  int hook_id = -1;
  if (mode == "graph_hostread") {
    hook_id = chunk->AddGradReadyHook(
        [chunk](const std::vector<Parameter*>&) -> absl::Status {
          return chunk->parameters()[0]->main_grad.To(Device::CPU()).status();
        });
  }
  pipeline::PipelineOptions schedule;
  schedule.schedule = pipeline::ScheduleKind::kNoPipelining;
  MCC_ASSIGN_OR_RETURN(auto executor, pipeline::PipelineExecutor::Create(
                                          stages, nullptr, schedule));
  fsdp::FsdpConfig dp_config;
  dp_config.strategy = fsdp::ShardingStrategy::kNoShard;
  dp_config.ddp.overlap_grad_reduce = false;  // Reduced after the graphs.
  dp_config.ddp.bucket_size_bytes = 8192;
  MCC_ASSIGN_OR_RETURN(
      auto data_parallel,
      training::WrapDataParallel(training::AsModels(model->chunks()), dp,
                                 nullptr, dp_config));
  optim::OptimizerConfig opt_config;
  opt_config.type = optim::OptimizerType::kAdam;
  opt_config.weight_decay = 0.01;
  opt_config.clip_grad = 0.5;
  if (dtype == DType::kFloat16) {
    // Step 0 overflows and is skipped; the scale then grows every step, so
    // grad_scale changes between steps.
    opt_config.loss_scaling = true;
    opt_config.loss_scaler.initial_scale = 4294967296.0;
    opt_config.loss_scaler.backoff_factor = 1.0 / (1 << 20);
    opt_config.loss_scaler.hysteresis = 1;
    opt_config.loss_scaler.growth_interval = 1;
  }
  optim::OptimizerGroups groups;
  groups.tensor = state->tensor();
  groups.pipeline = state->pipeline();
  groups.model = state->model();
  MCC_ASSIGN_OR_RETURN(auto optimizer,
                       data_parallel->CreateOptimizer(opt_config, groups));
  optim::LrScheduleConfig lr;
  lr.lr = 1e-2;
  lr.min_lr = 1e-3;
  lr.warmup_iters = 1;
  lr.decay_iters = kSteps;
  MCC_ASSIGN_OR_RETURN(optim::LrSchedule lr_schedule,
                       optim::LrSchedule::Create(lr));
  training::TrainerParts parts;
  parts.models = training::AsModels(model->chunks());
  parts.executor = executor.get();
  parts.data_parallel = data_parallel.get();
  parts.optimizer = optimizer.get();
  parts.dp_group = dp;
  MCC_ASSIGN_OR_RETURN(auto trainer,
                       training::Trainer::Create(parts, lr_schedule));

  std::vector<std::string> lines;
  const int local = kGlobalMicrobatches / dp->size();
  for (int step = 0; step < kSteps; ++step) {
    std::vector<MicroBatch> batches;
    for (int i = 0; i < local; ++i) {
      MCC_ASSIGN_OR_RETURN(MicroBatch b,
                           Batch(config, step, dp->rank() * local + i, device));
      batches.push_back(std::move(b));
    }
    if (graphed) {
      MCC_RETURN_IF_ERROR(graph_stage->SetMicroBatches(std::move(batches)));
    } else {
      MCC_RETURN_IF_ERROR(model->SetMicroBatches(std::move(batches)));
    }
    MCC_ASSIGN_OR_RETURN(training::StepMetrics m,
                         trainer->Step(local, step + 1));
    lines.push_back(absl::StrCat("step ", step, " ", Bits(m.loss), " ",
                                 Bits(m.loss_tokens), " ", Bits(m.grad_norm),
                                 " ", m.skipped, " ", Bits(m.loss_scale)));
  }
  MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
  for (const auto& p : model->parameters()) {
    MCC_ASSIGN_OR_RETURN(std::string line,
                         BitsLine(absl::StrCat("param ", p->name), p->value));
    lines.push_back(std::move(line));
  }
  for (const optim::StateTensor& st : optimizer->StateTensors()) {
    MCC_ASSIGN_OR_RETURN(
        std::string line,
        BitsLine(absl::StrCat("state ", st.name, " ", st.offset), st.tensor));
    lines.push_back(std::move(line));
  }
  if (graphed) {
    const GraphedStageStats& s = graph_stage->stats();
    lines.push_back(absl::StrCat("graph ", s.eager_microbatches, " ",
                                 s.captures, " ", s.replays));
  }
  if (hook_id >= 0) chunk->RemoveGradReadyHook(hook_id);
  return lines;
}

std::string ResultPath(const std::string& mode, const std::string& dtype,
                       int dp, int rank) {
  return TmpPath(
      absl::StrCat("graphed_stage.", mode, ".", dtype, ".dp", dp, ".", rank));
}

MCC_WORKER(graphed_stage) {
  const std::string mode = std::getenv("MCC_TEST_MODE");
  const std::string dtype = std::getenv("MCC_TEST_DTYPE");
  const int dp = std::atoi(std::getenv("MCC_TEST_DP"));
  auto job = InitParityJob(Device::TestDevice(0), parallel::ParallelSizes());
  if (!job.ok()) {
    std::fprintf(stderr, "init: %s\n", job.status().ToString().c_str());
    return 3;
  }
  auto lines = Train(job->state.get(), mode,
                     dtype == "fp16" ? DType::kFloat16 : DType::kFloat32);
  if (!lines.ok()) {
    std::fprintf(stderr, "%s %s: %s\n", mode.c_str(), dtype.c_str(),
                 lines.status().ToString().c_str());
    return 4;
  }
  return WriteLines(ResultPath(mode, dtype, dp, job->world.group->rank()),
                    *lines)
                 .ok()
             ? 0
             : 5;
}

std::vector<comm::testing::WorkerResult> RunMode(const std::string& mode,
                                                 const std::string& dtype,
                                                 int dp) {
  return comm::testing::RunWorkers(dp, "graphed_stage", absl::Seconds(180),
                                   [&](int) {
                                     return std::map<std::string, std::string>{
                                         {"MCC_TEST_MODE", mode},
                                         {"MCC_TEST_DTYPE", dtype},
                                         {"MCC_TEST_DP", absl::StrCat(dp)}};
                                   });
}

struct Case {
  std::string dtype;
  int dp;
};

class GraphedStageTest : public ::testing::TestWithParam<Case> {};

TEST_P(GraphedStageTest, ReplaysTrainBitForBitAsEager) {
  const Case c = GetParam();
  for (const std::string mode : {"eager", "graph"}) {
    auto workers = RunMode(mode, c.dtype, c.dp);
    for (const auto& w : workers) {
      ASSERT_EQ(w.exit_code, 0) << mode << "\n"
                                << comm::testing::Describe(workers);
    }
  }
  for (int rank = 0; rank < c.dp; ++rank) {
    SCOPED_TRACE(absl::StrCat(c.dtype, " dp ", c.dp, " rank ", rank));
    std::vector<std::string> eager =
        ReadLines(ResultPath("eager", c.dtype, c.dp, rank));
    std::vector<std::string> graph =
        ReadLines(ResultPath("graph", c.dtype, c.dp, rank));
    ASSERT_FALSE(graph.empty());
    // The graph run's own line: eager micro-batches, captures, replays.
    const std::string stats = graph.back();
    graph.pop_back();
    int64_t eager_n = 0, captures = 0, replays = 0;
    ASSERT_EQ(std::sscanf(stats.c_str(), "graph %ld %ld %ld", &eager_n,
                          &captures, &replays),
              3)
        << stats;
    // 12 training micro-batches over the ranks (3 steps x 4 / dp per rank):
    // most of them replays, not eager runs.
    const int64_t per_rank = kSteps * kGlobalMicrobatches / c.dp;
    EXPECT_EQ(eager_n + captures + replays, per_rank) << stats;
    EXPECT_GE(replays, c.dtype == "fp16" ? 1 : per_rank / 2) << stats;
    EXPECT_GE(captures, 1) << stats;
    ASSERT_EQ(eager.size(), graph.size());
    int steps = 0;
    for (size_t i = 0; i < eager.size(); ++i) {
      EXPECT_EQ(graph[i], eager[i]) << "line " << i;
      steps += eager[i].rfind("step ", 0) == 0;
    }
    EXPECT_EQ(steps, kSteps);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, GraphedStageTest,
                         ::testing::Values(Case{"fp32", 1}, Case{"fp16", 1},
                                           Case{"fp32", 2}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return absl::StrCat(info.param.dtype, "_dp",
                                               info.param.dp);
                         });

// The parity above can fail: replays that leave the captured micro-batch's
// inputs in place train on the wrong data.
TEST(GraphedStageFaults, AnInputNotCopiedInIsCaught) {
  for (const std::string mode : {"eager", "graph_nocopy"}) {
    auto workers = RunMode(mode, "fp32", 1);
    ASSERT_EQ(workers[0].exit_code, 0) << comm::testing::Describe(workers);
  }
  const std::vector<std::string> eager =
      ReadLines(ResultPath("eager", "fp32", 1, 0));
  const std::vector<std::string> nocopy =
      ReadLines(ResultPath("graph_nocopy", "fp32", 1, 0));
  ASSERT_FALSE(eager.empty());
  ASSERT_FALSE(nocopy.empty());
  // The first step's loss already differs (its micro-batches 2 and 3 are
  // replays of micro-batch 1's inputs).
  EXPECT_NE(nocopy[0], eager[0]);
}

TEST(GraphedStageFaults, AHostReadInsideTheCaptureStopsTraining) {
  auto workers = RunMode("graph_hostread", "fp32", 1);
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_EQ(workers[0].exit_code, 4) << comm::testing::Describe(workers);
  const std::string err = comm::testing::Describe(workers);
  EXPECT_TRUE(absl::StrContains(err, "--cuda-graph")) << err;
  EXPECT_TRUE(absl::StrContains(err, "graph capture")) << err;
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
