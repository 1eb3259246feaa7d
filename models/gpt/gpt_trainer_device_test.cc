// The full GPT trained through the trainer (training/trainer.h) on the test
// device (core/testing/test_device.h: a device that is not the host, whose
// memory the host cannot dereference) gives the CPU run's losses, gradient
// norms, loss scales, final weights and optimizer state (whose moments
// carry the gradients) bit for bit, in real processes, under the parallel
// layouts the device path must carry:
//   - serial (one process; plain DDP over a data-parallel group of one);
//   - TP 2 + SP (the trainer's sequence-parallel gradient finalisation);
//   - PP 2 interleaved (two virtual stages per rank, StageModel chunks, the
//     pipeline executor's receive buffers, the tied embedding's sum);
//   - DP 2 with the distributed optimizer (Megatron's
//     --use-distributed-optimizer: fsdp strategy optim, with
//     --overlap-grad-reduce and --overlap-param-gather);
//   - ZeRO-3 over DP 2 (fsdp strategy optim_grads_params);
// each in fp32, bf16 and fp16 (fp16 with the dynamic loss scaler, whose
// first step overflows and is skipped). The device run executes the same
// kernels in the same order as the CPU run, so any difference is a host-side
// shortcut, a lost operation or a buffer left on the wrong device; a host
// dereference of device memory kills the worker, whose stderr the test prints.
//
// Each (layout, dtype, device) runs in its own processes (two, or one for
// serial) and
// writes what it saw as text lines (bit patterns of every double and
// weight); the test then compares the CPU lines with the device lines.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/stage_model.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/weight_hash.h"
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
constexpr int kGlobalMicrobatches = 4;  // A multiple of the pipeline size.
constexpr int64_t kBatch = 2;

// Four layers: with PP 2 and one layer per virtual stage, two chunks per
// rank. Dropout and a loss mask take those paths too.
GPTConfig Config() {
  GPTConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 64;
  c.seq_length = 8;
  c.seed = 11;
  c.hidden_dropout = 0.1;
  c.attention_dropout = 0.1;
  return c;
}

// Global micro-batch `index` of step `step`, on `device`.
absl::StatusOr<MicroBatch> Batch(const GPTConfig& c, int step, int index,
                                 Device device) {
  std::mt19937 rng(900 + 37 * step + index);
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
  if (index % 2 == 1) {
    MCC_ASSIGN_OR_RETURN(Tensor m,
                         Tensor::FromVector(mask, {kBatch, c.seq_length}));
    MCC_ASSIGN_OR_RETURN(b.loss_mask, m.To(device));
  }
  return b;
}

using parallel::testing::Bits;
using parallel::testing::BitsLine;
using parallel::testing::InitParityJob;
using parallel::testing::ParityDevice;
using parallel::testing::ReadLines;
using parallel::testing::TmpPath;
using parallel::testing::WriteLines;

// Moves the first element of the first (fp32) parameter by one part in
// 1024, through the copy hook: the control run that the comparison must
// tell apart from the CPU's. (One unit in the last place of a small weight
// is too little: the first Adam update, far larger, rounds it away.)
absl::Status NudgeFirstWeight(StageModel* model) {
  Parameter& p = *model->parameters()[0];
  if (p.value.dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError("the nudged run must be fp32");
  }
  MCC_ASSIGN_OR_RETURN(Tensor host, p.value.To(Device::CPU()));
  host.data<float>()[0] *= 1.0f + 1.0f / 1024;
  return p.value.CopyFrom(host);
}

DType ParseDType(const std::string& name) {
  if (name == "bf16") return DType::kBFloat16;
  if (name == "fp16") return DType::kFloat16;
  return DType::kFloat32;
}

// Trains through the trainer and returns the lines to compare: per step
// "step <i> <loss> <tokens> <grad norm> <skipped> <loss scale>", then
// "eval <loss sum> <tokens>" of a held-out evaluation, then
// "param <name> <bits...>" for every parameter of this rank, "state <name>
// <offset> <bits...>" for every optimizer state tensor, then "moved"
// (whether training changed the weights).
absl::StatusOr<std::vector<std::string>> Train(parallel::ParallelState* state,
                                               const std::string& layout,
                                               DType dtype, Device device,
                                               bool nudge) {
  const GPTConfig config = Config();
  comm::ProcessGroup* pp = state->pipeline();
  comm::ProcessGroup* dp = state->data();
  const bool pipelined = pp->size() > 1;
  parallel::LayerContext ctx;
  if (state->tensor()->size() > 1) {
    ctx.tp_group = state->tensor();
    ctx.sequence_parallel = true;
  }
  ctx.dtype = dtype;
  ctx.seed = config.seed;
  ctx.device = device;  // Parameters, gradients and buffers are built there.
  pipeline::PipelineConfig split;
  split.num_layers = config.num_layers;
  split.pipeline_size = pp->size();
  split.layers_per_virtual_stage = pipelined ? 1 : 0;
  MCC_ASSIGN_OR_RETURN(auto model,
                       StageModel::Create(config, ctx, split, pp->rank()));
  if (pipelined && model->num_chunks() != 2) {
    return absl::InternalError("PP 2 interleaved built no two chunks");
  }
  // Before data parallelism and the optimizer copy the weights.
  if (nudge) MCC_RETURN_IF_ERROR(NudgeFirstWeight(model.get()));
  pipeline::PipelineOptions schedule;
  schedule.schedule = pipelined ? pipeline::ScheduleKind::kOneFOneB
                                : pipeline::ScheduleKind::kNoPipelining;
  MCC_ASSIGN_OR_RETURN(
      auto executor, pipeline::PipelineExecutor::Create(
                         model->stages(), pipelined ? pp : nullptr, schedule));

  fsdp::FsdpConfig dp_config;
  dp_config.strategy =
      layout == "zero3_dp2" ? fsdp::ShardingStrategy::kOptimGradsParams
      : layout == "dp2_distopt" || pipelined ? fsdp::ShardingStrategy::kOptim
                                             : fsdp::ShardingStrategy::kNoShard;
  dp_config.ddp.use_distributed_optimizer =
      dp_config.strategy == fsdp::ShardingStrategy::kOptim;
  dp_config.ddp.overlap_grad_reduce = true;
  dp_config.ddp.overlap_param_gather = dp_config.ddp.use_distributed_optimizer;
  dp_config.ddp.bucket_size_bytes = 8192;  // Several buckets.
  MCC_ASSIGN_OR_RETURN(
      auto data_parallel,
      training::WrapDataParallel(training::AsModels(model->chunks()), dp, pp,
                                 dp_config));

  optim::OptimizerConfig opt_config;
  opt_config.type = optim::OptimizerType::kAdam;
  opt_config.weight_decay = 0.01;
  opt_config.clip_grad = 0.5;
  if (dtype == DType::kFloat16) {
    // Step 0 overflows at 2^32 (inf in the fp16 gradients, found on the
    // device) and is skipped; the scale drops to 2^12 at once and grows
    // after each clean step.
    opt_config.loss_scaling = true;
    opt_config.loss_scaler.initial_scale = 4294967296.0;
    opt_config.loss_scaler.backoff_factor = 1.0 / (1 << 20);
    opt_config.loss_scaler.hysteresis = 1;
    opt_config.loss_scaler.growth_interval = 1;
  }
  optim::OptimizerGroups groups;
  groups.tensor = state->tensor();
  groups.pipeline = pp;
  groups.model = state->model();
  MCC_ASSIGN_OR_RETURN(auto optimizer,
                       data_parallel->CreateOptimizer(opt_config, groups));

  if (optimizer->device() != device) {
    return absl::InternalError(absl::StrCat("the optimizer lives on ",
                                            optimizer->device().ToString()));
  }
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
  parts.embedding_group = pipelined ? state->embedding() : nullptr;
  MCC_ASSIGN_OR_RETURN(auto trainer,
                       training::Trainer::Create(parts, lr_schedule));

  const bool zero3 =
      dp_config.strategy == fsdp::ShardingStrategy::kOptimGradsParams;
  if (zero3) MCC_RETURN_IF_ERROR(data_parallel->GatherFullParams());
  std::vector<std::vector<float>> initial;
  for (const auto& p : model->parameters()) {
    MCC_ASSIGN_OR_RETURN(Tensor host, p->value.To(Device::CPU()));
    initial.push_back(host.ToFloats());
  }
  if (zero3) MCC_RETURN_IF_ERROR(data_parallel->ReleaseFullParams());

  std::vector<std::string> lines;
  const int local = kGlobalMicrobatches / dp->size();
  for (int step = 0; step < kSteps; ++step) {
    std::vector<MicroBatch> batches;
    for (int i = 0; i < local; ++i) {
      MCC_ASSIGN_OR_RETURN(MicroBatch b,
                           Batch(config, step, dp->rank() * local + i, device));
      batches.push_back(std::move(b));
    }
    MCC_RETURN_IF_ERROR(model->SetMicroBatches(std::move(batches)));
    MCC_ASSIGN_OR_RETURN(training::StepMetrics m,
                         trainer->Step(local, step + 1));
    lines.push_back(absl::StrCat("step ", step, " ", Bits(m.loss), " ",
                                 Bits(m.loss_tokens), " ", Bits(m.grad_norm),
                                 " ", m.skipped, " ", Bits(m.loss_scale)));
  }
  MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
  // Evaluation (forward only, through the same pipeline and hooks) on
  // micro-batches no step saw.
  std::vector<MicroBatch> held_out;
  for (int i = 0; i < local; ++i) {
    MCC_ASSIGN_OR_RETURN(MicroBatch b,
                         Batch(config, kSteps, dp->rank() * local + i, device));
    held_out.push_back(std::move(b));
  }
  MCC_RETURN_IF_ERROR(model->SetMicroBatches(std::move(held_out)));
  MCC_ASSIGN_OR_RETURN(training::EvalMetrics eval, trainer->Evaluate(local));
  lines.push_back(
      absl::StrCat("eval ", Bits(eval.sum), " ", Bits(eval.tokens)));
  if (zero3) MCC_RETURN_IF_ERROR(data_parallel->GatherFullParams());
  // The replicas hold the same weights (read through the copy hook).
  MCC_RETURN_IF_ERROR(
      data_parallel::CheckWeightHashAcrossReplicas(model->parameters(), dp));
  bool moved = false;
  for (size_t k = 0; k < model->parameters().size(); ++k) {
    const Parameter& p = *model->parameters()[k];
    if (p.value.device() != device) {
      return absl::InternalError(absl::StrCat(
          "parameter ", p.name, " left the device: ", p.value.Describe()));
    }
    // The device's copy hook brings the weights to the host.
    MCC_ASSIGN_OR_RETURN(Tensor host, p.value.To(Device::CPU()));
    const std::vector<float> values = host.ToFloats();
    std::string line = absl::StrCat("param ", p.name);
    for (float v : values) absl::StrAppend(&line, " ", Bits(v));
    lines.push_back(std::move(line));
    if (values != initial[k]) moved = true;
  }
  // The optimizer's state (Adam's moments, fp32 main weights; this rank's
  // shards under the sharded layouts): the moments hold every step's
  // clipped gradients, so equal bits mean equal gradients.
  for (const optim::StateTensor& st : optimizer->StateTensors()) {
    if (st.tensor.device() != device) {
      return absl::InternalError(absl::StrCat(
          "optimizer state ", st.name, " is not on ", device.ToString()));
    }
    MCC_ASSIGN_OR_RETURN(
        std::string line,
        BitsLine(absl::StrCat("state ", st.name, " ", st.offset), st.tensor));
    lines.push_back(std::move(line));
  }
  lines.push_back(absl::StrCat("moved ", moved));
  if (zero3) MCC_RETURN_IF_ERROR(data_parallel->ReleaseFullParams());
  return lines;
}

std::string ResultPath(const std::string& layout, const std::string& dtype,
                       const std::string& device, int rank) {
  return TmpPath(
      absl::StrCat("gpt_trainer.", layout, ".", dtype, ".", device, ".", rank));
}

MCC_WORKER(gpt_trainer_device) {
  const std::string layout = std::getenv("MCC_TEST_CASE");
  const std::string dtype = std::getenv("MCC_TEST_DTYPE");
  const std::string device_name = std::getenv("MCC_TEST_DEVICE");
  const bool nudge = std::getenv("MCC_TEST_NUDGE") != nullptr;
  const Device device = ParityDevice(device_name);
  parallel::ParallelSizes sizes;
  if (layout == "pp2_interleaved") sizes.pipeline = 2;
  if (layout == "tp2_sp") sizes.tensor = 2;
  auto job = InitParityJob(device, sizes);
  if (!job.ok()) {
    std::fprintf(stderr, "init: %s\n", job.status().ToString().c_str());
    return 3;
  }
  auto lines =
      Train(job->state.get(), layout, ParseDType(dtype), device, nudge);
  if (!lines.ok()) {
    std::fprintf(stderr, "%s %s on %s: %s\n", layout.c_str(), dtype.c_str(),
                 device_name.c_str(), lines.status().ToString().c_str());
    return 4;
  }
  const absl::Status written = WriteLines(
      ResultPath(layout, dtype, nudge ? device_name + "_nudged" : device_name,
                 job->world.group->rank()),
      *lines);
  return written.ok() ? 0 : 5;
}

struct Case {
  std::string layout;
  std::string dtype;
  int processes() const { return layout == "serial" ? 1 : 2; }
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return absl::StrCat(info.param.layout, "_", info.param.dtype);
}

// Trains `c` on its processes on `device` (with the first weight nudged);
// the workers write their lines.
void RunWorkers(const Case& c, const std::string& device, bool nudge) {
  auto workers = comm::testing::RunWorkers(
      c.processes(), "gpt_trainer_device", absl::Seconds(180), [&](int) {
        std::map<std::string, std::string> env{{"MCC_TEST_CASE", c.layout},
                                               {"MCC_TEST_DTYPE", c.dtype},
                                               {"MCC_TEST_DEVICE", device}};
        if (nudge) env["MCC_TEST_NUDGE"] = "1";
        return env;
      });
  for (const auto& w : workers) {
    ASSERT_EQ(w.exit_code, 0) << device << "\n"
                              << comm::testing::Describe(workers);
  }
}

class GPTTrainerDeviceTest : public ::testing::TestWithParam<Case> {};

TEST_P(GPTTrainerDeviceTest, TestDeviceTrainsBitForBitAsTheCpu) {
  const Case c = GetParam();
  for (const std::string device : {"cpu", "testdev"}) {
    RunWorkers(c, device, /*nudge=*/false);
    if (HasFatalFailure()) return;
  }
  for (int rank = 0; rank < c.processes(); ++rank) {
    SCOPED_TRACE(absl::StrCat(c.layout, " ", c.dtype, " rank ", rank));
    const std::vector<std::string> cpu =
        ReadLines(ResultPath(c.layout, c.dtype, "cpu", rank));
    const std::vector<std::string> dev =
        ReadLines(ResultPath(c.layout, c.dtype, "testdev", rank));
    ASSERT_EQ(cpu.size(), dev.size());
    int steps = 0, params = 0, states = 0, evals = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      EXPECT_EQ(dev[i], cpu[i]) << "line " << i;
      steps += cpu[i].rfind("step ", 0) == 0;
      params += cpu[i].rfind("param ", 0) == 0;
      states += cpu[i].rfind("state ", 0) == 0;
      evals += cpu[i].rfind("eval ", 0) == 0;
      // Every step updated the weights (a skipped step would compare equal
      // without testing the update), except fp16's first, which overflows
      // on purpose to take the loss scaler's skip path.
      if (cpu[i].rfind("step ", 0) == 0) {
        std::istringstream s(cpu[i]);
        std::string word, loss, tokens, norm;
        int index = 0, skipped = 1;
        s >> word >> index >> loss >> tokens >> norm >> skipped;
        EXPECT_EQ(skipped, c.dtype == "fp16" && index == 0) << cpu[i];
      }
    }
    EXPECT_EQ(steps, kSteps);
    EXPECT_GT(params, 0);
    EXPECT_GT(states, 0);
    EXPECT_EQ(evals, 1);
    ASSERT_FALSE(cpu.empty());
    EXPECT_EQ(cpu.back(), "moved 1")
        << "training left the weights as they were";
  }
}

// The comparison above can fail: a device run whose first weight starts
// one part in 1024 away from the CPU's is told apart on every rank (through
// the losses, the gradient norms and the weights).
TEST(GPTTrainerDeviceControl, ANudgedDeviceRunIsCaught) {
  const Case c{"dp2_distopt", "fp32"};
  RunWorkers(c, "cpu", /*nudge=*/false);
  if (HasFatalFailure()) return;
  RunWorkers(c, "testdev", /*nudge=*/true);
  if (HasFatalFailure()) return;
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<std::string> cpu =
        ReadLines(ResultPath(c.layout, c.dtype, "cpu", rank));
    const std::vector<std::string> dev =
        ReadLines(ResultPath(c.layout, c.dtype, "testdev_nudged", rank));
    ASSERT_EQ(cpu.size(), dev.size());
    int differ = 0;
    for (size_t i = 0; i < cpu.size(); ++i) differ += cpu[i] != dev[i];
    EXPECT_GT(differ, 0) << "rank " << rank
                         << ": a nudged run compared equal to the CPU's";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, GPTTrainerDeviceTest,
    ::testing::Values(Case{"serial", "fp32"}, Case{"serial", "bf16"},
                      Case{"serial", "fp16"}, Case{"tp2_sp", "fp32"},
                      Case{"tp2_sp", "bf16"}, Case{"tp2_sp", "fp16"},
                      Case{"pp2_interleaved", "fp32"},
                      Case{"pp2_interleaved", "bf16"},
                      Case{"pp2_interleaved", "fp16"},
                      Case{"dp2_distopt", "fp32"}, Case{"dp2_distopt", "bf16"},
                      Case{"dp2_distopt", "fp16"}, Case{"zero3_dp2", "fp32"},
                      Case{"zero3_dp2", "bf16"}, Case{"zero3_dp2", "fp16"}),
    CaseName);

}  // namespace
}  // namespace gpt
}  // namespace mcc
