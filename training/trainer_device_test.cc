// The trainer on the test device (a device that is not the host:
// core/testing/test_device.h), in real processes, with a model that is not
// the GPT (parallel/testing/mlp_stack.h): serial, DP 2 with the
// distributed optimizer, ZeRO-3 and PP 2 interleaved, with AdamW, clipping
// and dynamic loss scaling.
//
// It checks the trainer's host-synchronisation contract: the losses and
// the gradient statistics stay on the device (the pipeline totals and
// broadcasts the losses there, the data-parallel group sums them there),
// and a whole Step makes exactly one device-to-host copy, which reads the
// loss and the gradient norm together, and no host-to-device copy (the
// micro-batches are staged before it). And it checks that nothing was
// lost on the way: every step's metrics and the final weights equal the
// CPU run's bit for bit.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/status_macros.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/testing/device_parity.h"
#include "parallel/testing/mlp_stack.h"
#include "training/trainer.h"

namespace mcc {
namespace training {
namespace {

using parallel::testing::Bits;
using parallel::testing::BitsLine;
using parallel::testing::InitParityJob;
using parallel::testing::MakeMlpBatch;
using parallel::testing::MlpBatch;
using parallel::testing::MlpStack;
using parallel::testing::MlpStackConfig;
using parallel::testing::ParityDevice;
using parallel::testing::ReadLines;
using parallel::testing::TmpPath;
using parallel::testing::WriteLines;

constexpr int kSteps = 4;
constexpr int kMicrobatches = 4;  // Global, per step.

optim::LrSchedule Schedule() {
  optim::LrScheduleConfig c;
  c.lr = 1e-2;
  c.min_lr = 1e-3;
  c.warmup_iters = 1;
  c.decay_iters = kSteps;
  c.decay_style = optim::LrDecayStyle::kLinear;
  return *optim::LrSchedule::Create(c);
}

// Lines "step ..." (metrics and the step's device copies) and "param ...".
// A layout ending in "_offload" runs --optimizer-cpu-offload with half the
// state on the host, on the test device only (the CPU run it is compared
// with has nothing to offload).
absl::StatusOr<std::vector<std::string>> Train(parallel::ParallelState* state,
                                               absl::string_view name,
                                               Device device) {
  const bool offload = absl::ConsumeSuffix(&name, "_offload");
  const std::string layout(name);
  const MlpStackConfig config;
  comm::ProcessGroup* pp = state->pipeline();
  comm::ProcessGroup* dp = state->data();
  const int stages = pp->size(), stage = pp->rank();
  const int dp_rank = dp->rank();
  const int virtual_stages = layout == "pp2_interleaved" ? 2 : 1;
  const int per_chunk = config.num_blocks / (stages * virtual_stages);
  const int local_mb = kMicrobatches / dp->size();

  parallel::LayerContext context;
  context.device = device;
  std::vector<std::unique_ptr<MlpStack>> chunks;
  TrainerParts parts;
  ParameterList params;
  for (int v = 0; v < virtual_stages; ++v) {
    MCC_ASSIGN_OR_RETURN(
        auto chunk,
        MlpStack::Create(config, context, (v * stages + stage) * per_chunk,
                         per_chunk));
    for (const auto& p : chunk->parameters()) params.push_back(p);
    parts.models.push_back(chunk.get());
    parts.stages.push_back(chunk.get());
    chunks.push_back(std::move(chunk));
  }
  std::unique_ptr<pipeline::PipelineExecutor> executor;
  if (stages > 1) {
    MCC_ASSIGN_OR_RETURN(
        executor, pipeline::PipelineExecutor::Create(parts.stages, pp, {}));
    parts.executor = executor.get();
  }
  optim::OptimizerConfig opt_config;
  opt_config.type = optim::OptimizerType::kAdam;
  opt_config.clip_grad = 0.5;  // Small enough to clip.
  opt_config.loss_scaling = true;
  opt_config.loss_scaler.initial_scale = 1024;
  opt_config.loss_scaler.growth_interval = 2;
  if (offload && !device.is_cpu()) opt_config.cpu_offload_fraction = 0.5;
  optim::OptimizerGroups groups;
  groups.pipeline = pp;
  groups.model = pp;
  std::unique_ptr<data_parallel::DataParallel> wrapped;
  std::unique_ptr<optim::Optimizer> optimizer;
  if (dp->size() > 1) {
    fsdp::FsdpConfig c;
    c.strategy = layout == "zero3_dp2"
                     ? fsdp::ShardingStrategy::kOptimGradsParams
                     : fsdp::ShardingStrategy::kOptim;
    c.ddp.overlap_grad_reduce = true;
    c.ddp.bucket_size_bytes = 4096;  // Several buckets.
    MCC_ASSIGN_OR_RETURN(wrapped, WrapDataParallel(parts.models, dp, pp, c));
    MCC_ASSIGN_OR_RETURN(optimizer,
                         wrapped->CreateOptimizer(opt_config, groups));
    parts.data_parallel = wrapped.get();
    parts.dp_group = dp;
  } else {
    MCC_ASSIGN_OR_RETURN(optimizer,
                         optim::Optimizer::Create(params, opt_config, groups));
  }
  parts.optimizer = optimizer.get();
  MCC_ASSIGN_OR_RETURN(auto trainer, Trainer::Create(parts, Schedule()));

  std::vector<std::string> lines;
  for (int step = 0; step < kSteps; ++step) {
    // Staged before the step: the step itself copies nothing to the device.
    auto batches = std::make_shared<std::vector<MlpBatch>>();
    for (int i = 0; i < local_mb; ++i) {
      MlpBatch b = MakeMlpBatch(config, step, dp_rank * local_mb + i);
      MCC_ASSIGN_OR_RETURN(b.inputs, b.inputs.To(device));
      MCC_ASSIGN_OR_RETURN(b.targets, b.targets.To(device));
      batches->push_back(std::move(b));
    }
    for (const auto& c : chunks) c->SetMicroBatches(batches);
    const int64_t reads = ::mcc::testing::TestDeviceCopiesToHost();
    const int64_t writes = ::mcc::testing::TestDeviceCopiesFromHost();
    MCC_ASSIGN_OR_RETURN(StepMetrics m, trainer->Step(local_mb, step + 1));
    lines.push_back(absl::StrCat(
        "step ", step, " ", ::mcc::testing::TestDeviceCopiesToHost() - reads,
        " ", ::mcc::testing::TestDeviceCopiesFromHost() - writes, " ",
        optimizer->offloaded_pieces(), " ", Bits(m.loss), " ",
        Bits(m.loss_tokens), " ", Bits(m.grad_norm), " ", m.skipped, " ",
        m.loss_scale, " ", m.loss));
  }
  MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
  if (wrapped && layout == "zero3_dp2") {
    MCC_RETURN_IF_ERROR(wrapped->GatherFullParams());
  }
  for (const auto& p : params) {
    if (p->value.device() != device) {
      return absl::InternalError(absl::StrCat(
          "parameter ", p->name, " left the device: ", p->value.Describe()));
    }
    MCC_ASSIGN_OR_RETURN(std::string line,
                         BitsLine(absl::StrCat("param ", p->name), p->value));
    lines.push_back(std::move(line));
  }
  if (wrapped && layout == "zero3_dp2") {
    MCC_RETURN_IF_ERROR(wrapped->ReleaseFullParams());
  }
  return lines;
}

MCC_WORKER(trainer_device) {
  const std::string layout = std::getenv("MCC_TEST_CASE");
  const std::string device_name = std::getenv("MCC_TEST_DEVICE");
  const Device device = ParityDevice(device_name);
  parallel::ParallelSizes sizes;
  if (layout == "pp2_interleaved") sizes.pipeline = 2;
  auto job = InitParityJob(device, sizes);
  if (!job.ok()) {
    std::fprintf(stderr, "init: %s\n", job.status().ToString().c_str());
    return 3;
  }
  auto lines = Train(job->state.get(), layout, device);
  if (!lines.ok()) {
    std::fprintf(stderr, "train: %s\n", lines.status().ToString().c_str());
    return 4;
  }
  const absl::Status written =
      WriteLines(TmpPath(absl::StrCat(layout, ".", device_name, ".rank",
                                      job->world.group->rank())),
                 *lines);
  return written.ok() ? 0 : 5;
}

class TrainerDeviceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainerDeviceTest, OneDeviceToHostCopyPerStepAndTheCpusBits) {
  const std::string layout = GetParam();
  const int ranks = absl::StartsWith(layout, "serial") ? 1 : 2;
  for (const std::string device : {"cpu", "testdev"}) {
    auto workers = comm::testing::RunWorkers(
        ranks, "trainer_device", absl::Seconds(120), [&](int) {
          return std::map<std::string, std::string>{
              {"MCC_TEST_CASE", layout}, {"MCC_TEST_DEVICE", device}};
        });
    for (const auto& w : workers) {
      ASSERT_EQ(w.exit_code, 0) << device << "\n"
                                << comm::testing::Describe(workers);
    }
  }
  for (int rank = 0; rank < ranks; ++rank) {
    const std::vector<std::string> cpu =
        ReadLines(TmpPath(absl::StrCat(layout, ".cpu.rank", rank)));
    const std::vector<std::string> dev =
        ReadLines(TmpPath(absl::StrCat(layout, ".testdev.rank", rank)));
    ASSERT_EQ(cpu.size(), dev.size()) << "rank " << rank;
    int steps = 0, params = 0;
    double first_loss = 0, last_loss = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      std::istringstream c(cpu[i]), d(dev[i]);
      std::string kind;
      d >> kind;
      if (kind != "step") {
        params += kind == "param";
        EXPECT_EQ(dev[i], cpu[i]) << layout << " rank " << rank;
        continue;
      }
      std::string ckind, crest, drest;
      int step = 0, cstep = 0;
      int64_t reads = -1, writes = -1, creads = -1, cwrites = -1;
      int64_t pieces = -1, cpieces = -1;
      d >> step >> reads >> writes >> pieces;
      c >> ckind >> cstep >> creads >> cwrites >> cpieces;
      std::getline(d, drest);
      std::getline(c, crest);
      // The CPU run makes no device copies at all.
      EXPECT_EQ(creads, 0);
      EXPECT_EQ(cwrites, 0);
      EXPECT_EQ(cpieces, 0);
      // Offloading: each host piece's gradient comes over and its weights
      // go back once per step, beside the step's one read.
      const bool offload = absl::EndsWith(layout, "_offload");
      EXPECT_EQ(pieces > 0, offload) << layout << " rank " << rank;
      EXPECT_EQ(reads, 1 + pieces)
          << layout << " rank " << rank << " step " << step
          << ": the step's device-to-host copies";
      EXPECT_EQ(writes, pieces) << layout << " rank " << rank << " step "
                                << step << ": the step's host-to-device copies";
      // Loss, tokens, norm, skipped, scale: the CPU's bits.
      EXPECT_EQ(drest, crest) << layout << " rank " << rank << " step " << step;
      std::istringstream fields(drest);
      std::string loss_bits, token_bits, norm_bits;
      int skipped = 1;
      double scale = 0, loss = 0;
      fields >> loss_bits >> token_bits >> norm_bits >> skipped >> scale >>
          loss;
      EXPECT_EQ(skipped, 0) << layout << " step " << step << " skipped";
      if (steps == 0) first_loss = loss;
      last_loss = loss;
      ++steps;
    }
    EXPECT_EQ(steps, kSteps);
    EXPECT_GT(params, 0);
    // Every rank reports the step's loss, and training lowers it.
    EXPECT_GT(first_loss, 0) << layout << " rank " << rank;
    EXPECT_LT(last_loss, first_loss) << layout << " rank " << rank;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TrainerDeviceTest,
                         ::testing::Values("serial", "dp2_distopt", "zero3_dp2",
                                           "pp2_interleaved", "serial_offload",
                                           "dp2_distopt_offload",
                                           "zero3_dp2_offload"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace training
}  // namespace mcc
