// The device is a construction parameter of the engine: the non-GPT
// MlpStack trains with its parameters, gradients, optimizer state, DDP
// buckets, FSDP shards and pipeline buffers on the test device (a device
// that is not the host: core/testing/test_device.h), in real processes,
// under DP 2 with the distributed optimizer, ZeRO-3 (FSDP
// optim_grads_params) and PP 2 interleaved, with AdamW, clipping and
// dynamic loss scaling. Every layout must give the CPU run's losses and
// parameters bit for bit: the device path runs the same kernels in the same
// order, so any difference is a host-side shortcut or a lost operation.
//
// It also checks the engine's host-synchronisation contract: between the
// end of the micro-batches and the next step's forward (gradient sync,
// finalisation, the optimizer step, the parameter gather) the engine makes
// exactly one device-to-host copy, the optimizer's read of the gradient
// statistics, and no host-to-device copy. The losses stay on the device
// (the pipeline totals and broadcasts them there); the test's own reads of
// them are outside that window. training/trainer_device_test.cc counts the
// trainer's whole step.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
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
#include "optim/optimizer.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/testing/device_parity.h"
#include "parallel/testing/mlp_stack.h"
#include "parallel/testing/train_step.h"

namespace mcc {
namespace parallel {
namespace testing {
namespace {

constexpr int kSteps = 4;
constexpr int kMicrobatches = 4;  // Global, per step.

struct Result {
  std::vector<std::string> lines;  // "loss ..." and "param ..." in order.
  // Device-to-host and host-to-device copies of the engine window, per step.
  std::vector<int64_t> engine_reads, engine_writes;
};

absl::StatusOr<Result> Train(ParallelState* state, const std::string& layout,
                             Device device) {
  const MlpStackConfig config;
  comm::ProcessGroup* pp = state->pipeline();
  comm::ProcessGroup* dp = state->data();
  const int stages = pp->size(), stage = pp->rank();
  const int dp_size = dp->size(), dp_rank = dp->rank();
  const int virtual_stages = layout == "pp2_interleaved" ? 2 : 1;
  const int local_mb = kMicrobatches / dp_size;

  LayerContext context;
  context.device = device;  // Parameters and buffers are built there.
  MCC_ASSIGN_OR_RETURN(
      MlpStackChunks local,
      CreateMlpStackChunks(config, context, stages, stage, virtual_stages));
  MlpStack* model = local.chunks[0].get();
  MCC_ASSIGN_OR_RETURN(auto executor,
                       pipeline::PipelineExecutor::Create(
                           local.stages, stages > 1 ? pp : nullptr,
                           pipeline::PipelineOptions()));
  optim::OptimizerConfig opt_config;
  opt_config.type = optim::OptimizerType::kAdam;
  opt_config.weight_decay = 0.01;
  opt_config.clip_grad = 0.5;  // Small enough to clip.
  opt_config.loss_scaling = true;
  opt_config.loss_scaler.initial_scale = 1024;
  opt_config.loss_scaler.growth_interval = 2;  // The scale changes too.
  optim::OptimizerGroups groups;
  groups.pipeline = pp;
  groups.model = pp;
  std::unique_ptr<data_parallel::DistributedDataParallel> ddp;
  std::unique_ptr<fsdp::FullyShardedDataParallel> fsdp;
  std::unique_ptr<optim::Optimizer> opt;
  data_parallel::DataParallel* data_parallel = nullptr;  // ddp or fsdp.
  if (layout == "zero3_dp2") {
    fsdp::FsdpConfig fsdp_config;
    fsdp_config.strategy = fsdp::ShardingStrategy::kOptimGradsParams;
    MCC_ASSIGN_OR_RETURN(
        fsdp, fsdp::FullyShardedDataParallel::Wrap(model, dp, fsdp_config));
    MCC_ASSIGN_OR_RETURN(opt, fsdp->CreateOptimizer(opt_config, groups));
    executor->SetLastMicrobatchCallback(
        [f = fsdp.get()](bool last) { f->set_is_last_microbatch(last); });
    data_parallel = fsdp.get();
  } else {
    data_parallel::DdpConfig ddp_config;
    ddp_config.use_distributed_optimizer = true;
    ddp_config.overlap_grad_reduce = true;
    ddp_config.bucket_size_bytes = 4096;  // Several buckets.
    MCC_ASSIGN_OR_RETURN(ddp, data_parallel::DistributedDataParallel::Create(
                                  local.parameters, dp, ddp_config));
    for (const auto& c : local.chunks) {
      c->AddGradReadyHook(ddp->GradReadyHook());
    }
    MCC_ASSIGN_OR_RETURN(opt, ddp->CreateOptimizer(opt_config, groups));
    executor->SetLastMicrobatchCallback(
        [d = ddp.get()](bool last) { d->set_is_last_microbatch(last); });
    data_parallel = ddp.get();
  }
  if (opt->device() != device) {
    return absl::InternalError(
        absl::StrCat("the optimizer lives on ", opt->device().ToString()));
  }

  // The starting weights (read outside the counted windows), to check that
  // training moved them.
  std::vector<std::vector<float>> initial;
  if (!fsdp) {
    for (const auto& p : local.parameters) {
      MCC_ASSIGN_OR_RETURN(Tensor host, p->value.To(Device::CPU()));
      initial.push_back(host.ToFloats());
    }
  }
  Result result;
  for (int step = 0; step < kSteps; ++step) {
    int64_t reads = ::mcc::testing::TestDeviceCopiesToHost();
    int64_t writes = ::mcc::testing::TestDeviceCopiesFromHost();
    MCC_RETURN_IF_ERROR(BeginTrainStep(data_parallel, local.models));
    int64_t engine_reads = ::mcc::testing::TestDeviceCopiesToHost() - reads;
    int64_t engine_writes = ::mcc::testing::TestDeviceCopiesFromHost() - writes;
    // Staging the micro-batches (host to device) and the forward/backward
    // with the model's loss reads: outside the engine window.
    auto batches = std::make_shared<std::vector<MlpBatch>>();
    for (int i = 0; i < local_mb; ++i) {
      MlpBatch b = MakeMlpBatch(config, step, dp_rank * local_mb + i);
      MCC_ASSIGN_OR_RETURN(b.inputs, b.inputs.To(device));
      MCC_ASSIGN_OR_RETURN(b.targets, b.targets.To(device));
      batches->push_back(std::move(b));
    }
    for (const auto& c : local.chunks) c->SetMicroBatches(batches);
    const float grad_scale = static_cast<float>(opt->loss_scale() / local_mb);
    MCC_ASSIGN_OR_RETURN(pipeline::PipelineStepResult run,
                         executor->Run(local_mb, grad_scale));
    // The test's own reads of the losses (the engine reads none).
    for (size_t i = 0; i < run.microbatch_losses.size(); ++i) {
      MCC_ASSIGN_OR_RETURN(LossSum loss, ReadLossSum(run.microbatch_losses[i]));
      result.lines.push_back(
          absl::StrCat("loss ", step, " ", dp_rank * local_mb + i, " ",
                       Bits(loss.sum), " ", Bits(loss.tokens)));
    }
    MCC_ASSIGN_OR_RETURN(Tensor totals, run.loss_totals.To(Device::CPU()));
    std::string line = absl::StrCat("totals ", step);
    for (float v : totals.ToFloats()) absl::StrAppend(&line, " ", Bits(v));
    result.lines.push_back(std::move(line));
    reads = ::mcc::testing::TestDeviceCopiesToHost();
    writes = ::mcc::testing::TestDeviceCopiesFromHost();
    MCC_ASSIGN_OR_RETURN(
        optim::StepInfo info,
        FinishTrainStep(data_parallel, local.models, *opt, 1e-2));
    engine_reads += ::mcc::testing::TestDeviceCopiesToHost() - reads;
    engine_writes += ::mcc::testing::TestDeviceCopiesFromHost() - writes;
    result.engine_reads.push_back(engine_reads);
    result.engine_writes.push_back(engine_writes);
    result.lines.push_back(absl::StrCat("norm ", step, " ",
                                        Bits(info.grad_norm), " ", info.skipped,
                                        " ", info.loss_scale));
  }
  if (fsdp) {
    MCC_RETURN_IF_ERROR(fsdp->FinishParamGather());
    MCC_RETURN_IF_ERROR(fsdp->GatherFullParams());
  } else {
    MCC_RETURN_IF_ERROR(ddp->FinishParamGather());
  }
  bool moved = false;
  for (size_t k = 0; k < local.parameters.size(); ++k) {
    const auto& p = local.parameters[k];
    if (p->value.device() != device) {
      return absl::InternalError(absl::StrCat(
          "parameter ", p->name, " left the device: ", p->value.Describe()));
    }
    MCC_ASSIGN_OR_RETURN(Tensor host, p->value.To(Device::CPU()));
    std::string line = absl::StrCat("param ", p->name);
    const std::vector<float> values = host.ToFloats();
    for (float v : values) absl::StrAppend(&line, " ", Bits(v));
    result.lines.push_back(std::move(line));
    if (k < initial.size() && values != initial[k]) moved = true;
  }
  if (!fsdp) result.lines.push_back(absl::StrCat("moved ", moved));
  if (fsdp) MCC_RETURN_IF_ERROR(fsdp->ReleaseFullParams());
  return result;
}

MCC_WORKER(device_train) {
  const std::string layout = std::getenv("MCC_TEST_CASE");
  const std::string device_name = std::getenv("MCC_TEST_DEVICE");
  const Device device = ParityDevice(device_name);
  ParallelSizes sizes;
  if (layout == "pp2_interleaved") sizes.pipeline = 2;
  auto job = InitParityJob(device, sizes);
  if (!job.ok()) {
    std::fprintf(stderr, "init: %s\n", job.status().ToString().c_str());
    return 3;
  }
  auto result = Train(job->state.get(), layout, device);
  if (!result.ok()) {
    std::fprintf(stderr, "train: %s\n", result.status().ToString().c_str());
    return 4;
  }
  const int rank = job->world.group->rank();
  std::vector<std::string> lines = result->lines;
  for (size_t s = 0; s < result->engine_reads.size(); ++s) {
    lines.push_back(absl::StrCat("engine ", s, " ", result->engine_reads[s],
                                 " ", result->engine_writes[s]));
  }
  const absl::Status written = WriteLines(
      TmpPath(absl::StrCat(layout, ".", device_name, ".rank", rank)), lines);
  return written.ok() ? 0 : 5;
}

class DeviceTrainingTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DeviceTrainingTest, TestDeviceMatchesCpuBitForBit) {
  const std::string layout = GetParam();
  for (const std::string device : {"cpu", "testdev"}) {
    auto workers = comm::testing::RunWorkers(
        2, "device_train", absl::Seconds(120), [&](int) {
          return std::map<std::string, std::string>{
              {"MCC_TEST_CASE", layout}, {"MCC_TEST_DEVICE", device}};
        });
    for (const auto& w : workers) {
      ASSERT_EQ(w.exit_code, 0) << device << "\n"
                                << comm::testing::Describe(workers);
    }
  }
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<std::string> cpu =
        ReadLines(TmpPath(absl::StrCat(layout, ".cpu.rank", rank)));
    const std::vector<std::string> dev =
        ReadLines(TmpPath(absl::StrCat(layout, ".testdev.rank", rank)));
    ASSERT_EQ(cpu.size(), dev.size()) << "rank " << rank;
    int losses = 0, params = 0, steps = 0;
    for (size_t i = 0; i < cpu.size(); ++i) {
      std::istringstream s(dev[i]);
      std::string kind;
      s >> kind;
      if (kind == "engine") {
        int step = 0;
        int64_t reads = -1, writes = -1;
        s >> step >> reads >> writes;
        // The CPU run makes no device copies at all.
        EXPECT_EQ(cpu[i], absl::StrCat("engine ", step, " 0 0"));
        EXPECT_EQ(reads, 1) << layout << " rank " << rank << " step " << step
                            << ": the engine's device-to-host copies";
        EXPECT_EQ(writes, 0) << layout << " rank " << rank << " step " << step
                             << ": the engine's host-to-device copies";
        ++steps;
        continue;
      }
      losses += kind == "loss";
      params += kind == "param";
      if (kind == "moved") {
        EXPECT_EQ(cpu[i], "moved 1") << layout << " rank " << rank
                                     << ": training left the weights as "
                                        "they were";
      }
      if (kind == "norm") {
        int step = 0;
        std::string bits;
        int skipped = 1;
        s >> step >> bits >> skipped;
        EXPECT_EQ(skipped, 0) << layout << " step " << step << " skipped";
      }
      EXPECT_EQ(dev[i], cpu[i]) << layout << " rank " << rank;
    }
    EXPECT_EQ(steps, kSteps);
    EXPECT_GT(params, 0);
    if (layout != "pp2_interleaved" || rank == 1) {
      EXPECT_GT(losses, 0) << "rank " << rank << " reported no loss";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DeviceTrainingTest,
                         ::testing::Values("dp2_distopt", "zero3_dp2",
                                           "pp2_interleaved"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace testing
}  // namespace parallel
}  // namespace mcc
