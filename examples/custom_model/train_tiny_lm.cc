// Trains TinyLm (tiny_lm.h) serially or, under @megatron_cpp//tools:launch,
// in one of megatron_cpp's parallel layouts on 2 processes:
//   serial           one process;
//   dp2              data parallelism (DistributedDataParallel);
//   dp2_zero3        ZeRO-3 (FullyShardedDataParallel, optim_grads_params);
//   pp2              two pipeline stages, 1F1B;
//   pp2_interleaved  two stages of two model chunks each, interleaved 1F1B;
//   pp2_zb_h1        two pipeline stages, zero-bubble ZB-H1 (the split
//                    backward, tiny_lm.h).
// The model is this workspace's; the training step is
// @megatron_cpp//training's Trainer. Each rank writes each step's loss and
// the parameters it holds to --out.RANK, one "loss STEP VALUE" or
// "param NAME COUNT VALUES..." per line, for compare_runs.py.
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "core/comm/init.h"
#include "core/status_macros.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "tiny_lm.h"
#include "training/trainer.h"

ABSL_FLAG(std::string, layout, "serial",
          "serial, dp2, dp2_zero3, pp2, pp2_interleaved or pp2_zb_h1.");
ABSL_FLAG(int, steps, 10, "Optimizer steps.");
ABSL_FLAG(double, lr, 0.2, "Learning rate (SGD with momentum 0.9).");
ABSL_FLAG(int, microbatches, 4, "Micro-batches per step, over all DP ranks.");
ABSL_FLAG(std::string, out, "", "Each rank writes its results to OUT.RANK.");
ABSL_FLAG(int, num_experts, 0,
          "The MoE variant: each block a mixture of this many experts "
          "(top-2); 0: dense blocks.");

namespace tiny_lm {
namespace {

using mcc::Tensor;
namespace parallel = mcc::parallel;

struct Layout {
  bool data_parallel = false;
  bool zero3 = false;
  int pipeline = 1;
  int virtual_stages = 1;
  mcc::pipeline::ScheduleKind schedule = mcc::pipeline::ScheduleKind::kOneFOneB;
};

absl::StatusOr<Layout> ParseLayout(const std::string& name) {
  Layout l;
  if (name == "serial") return l;
  if (name == "dp2" || name == "dp2_zero3") {
    l.data_parallel = true;
    l.zero3 = name == "dp2_zero3";
    return l;
  }
  if (name == "pp2" || name == "pp2_interleaved" || name == "pp2_zb_h1") {
    l.pipeline = 2;
    l.virtual_stages = name == "pp2_interleaved" ? 2 : 1;
    if (name == "pp2_zb_h1") {
      l.schedule = mcc::pipeline::ScheduleKind::kZeroBubbleH1;
    }
    return l;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--layout: '", name,
      "' is not serial, dp2, dp2_zero3, pp2, pp2_interleaved or pp2_zb_h1"));
}

absl::Status Train(const Layout& layout, parallel::ParallelState* state,
                   int rank, const std::string& out_path) {
  TinyLmConfig config;
  config.num_experts = absl::GetFlag(FLAGS_num_experts);
  mcc::comm::ProcessGroup* pp = state ? state->pipeline() : nullptr;
  mcc::comm::ProcessGroup* dp = state ? state->data() : nullptr;
  const int stages = pp ? pp->size() : 1;
  const int stage = pp ? pp->rank() : 0;
  const int dp_size = dp ? dp->size() : 1;
  const int dp_rank = dp ? dp->rank() : 0;
  const int chunks_total = stages * layout.virtual_stages;
  if (config.num_blocks % chunks_total != 0) {
    return absl::InvalidArgumentError("blocks do not split evenly");
  }
  const int per_chunk = config.num_blocks / chunks_total;
  const int microbatches = absl::GetFlag(FLAGS_microbatches);
  if (microbatches % dp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--microbatches ", microbatches, " is not a multiple of ",
                     "the data-parallel size ", dp_size));
  }
  const int local_mb = microbatches / dp_size;

  // This rank's model chunks: chunk v * stages + stage, as interleaving
  // assigns them.
  parallel::LayerContext context;
  std::vector<std::unique_ptr<TinyLm>> chunks;
  std::vector<parallel::PipelineStage*> stage_chunks;
  std::vector<parallel::Model*> models;
  mcc::ParameterList params;
  for (int v = 0; v < layout.virtual_stages; ++v) {
    MCC_ASSIGN_OR_RETURN(
        auto chunk,
        TinyLm::Create(config, context, (v * stages + stage) * per_chunk,
                       per_chunk));
    for (const auto& p : chunk->parameters()) params.push_back(p);
    stage_chunks.push_back(chunk.get());
    models.push_back(chunk.get());
    chunks.push_back(std::move(chunk));
  }
  mcc::pipeline::PipelineOptions pipeline_options;
  pipeline_options.schedule = layout.schedule;
  MCC_ASSIGN_OR_RETURN(
      auto executor,
      mcc::pipeline::PipelineExecutor::Create(
          stage_chunks, stages > 1 ? pp : nullptr, pipeline_options));

  mcc::optim::OptimizerConfig opt_config;
  opt_config.type = mcc::optim::OptimizerType::kSgd;
  opt_config.sgd_momentum = 0.9;
  opt_config.weight_decay = 0.01;
  opt_config.clip_grad = 0;
  mcc::optim::OptimizerGroups groups;
  std::unique_ptr<mcc::data_parallel::DataParallel> data_parallel;
  std::unique_ptr<mcc::optim::Optimizer> optimizer;
  if (layout.zero3) {
    mcc::fsdp::FsdpConfig fsdp;
    fsdp.strategy = mcc::fsdp::ShardingStrategy::kOptimGradsParams;
    MCC_ASSIGN_OR_RETURN(
        data_parallel,
        mcc::fsdp::FullyShardedDataParallel::Wrap(models[0], dp, fsdp));
  } else if (layout.data_parallel) {
    MCC_ASSIGN_OR_RETURN(data_parallel,
                         mcc::data_parallel::DistributedDataParallel::Wrap(
                             models, dp, mcc::data_parallel::DdpConfig()));
  }
  if (data_parallel) {
    MCC_ASSIGN_OR_RETURN(optimizer,
                         data_parallel->CreateOptimizer(opt_config, groups));
  } else {
    MCC_ASSIGN_OR_RETURN(
        optimizer, mcc::optim::Optimizer::Create(params, opt_config, groups));
  }

  // The step is @megatron_cpp//training's: micro-batches through the
  // schedule, gradient sync and finalisation, the optimizer, at a constant
  // learning rate.
  mcc::optim::LrScheduleConfig lr;
  lr.lr = lr.min_lr = absl::GetFlag(FLAGS_lr);
  lr.decay_style = mcc::optim::LrDecayStyle::kConstant;
  MCC_ASSIGN_OR_RETURN(mcc::optim::LrSchedule schedule,
                       mcc::optim::LrSchedule::Create(lr));
  mcc::training::TrainerParts parts;
  parts.models = models;
  parts.executor = executor.get();
  parts.data_parallel = data_parallel.get();
  parts.optimizer = optimizer.get();
  parts.dp_group = dp;
  MCC_ASSIGN_OR_RETURN(auto trainer,
                       mcc::training::Trainer::Create(parts, schedule));

  std::ofstream out(out_path);
  out.precision(17);
  for (int step = 0; step < absl::GetFlag(FLAGS_steps); ++step) {
    auto batches = std::make_shared<std::vector<TinyLmBatch>>();
    for (int i = 0; i < local_mb; ++i) {
      batches->push_back(MakeBatch(config, step, dp_rank * local_mb + i));
    }
    for (const auto& c : chunks) c->SetMicroBatches(batches);
    MCC_ASSIGN_OR_RETURN(mcc::training::StepMetrics metrics,
                         trainer->Step(local_mb, step + 1));
    // The global batch's mean loss, the same on every rank.
    out << "loss " << step << " " << metrics.loss << "\n";
  }
  MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
  if (data_parallel) {
    MCC_RETURN_IF_ERROR(data_parallel->FinishParamGather());
    MCC_RETURN_IF_ERROR(data_parallel->GatherFullParams());
  }
  // Data-parallel replicas hold the same parameters: rank 0 of DP writes.
  if (dp_rank == 0) {
    for (const auto& p : params) {
      const std::vector<float> values = p->value.ToFloats();
      out << "param " << p->name << " " << values.size();
      for (float v : values) out << " " << v;
      out << "\n";
    }
  }
  if (data_parallel) MCC_RETURN_IF_ERROR(data_parallel->ReleaseFullParams());
  out.close();
  if (!out) {
    return absl::InternalError(
        absl::StrCat("rank ", rank, ": cannot write ", out_path));
  }
  return absl::OkStatus();
}

absl::Status Run() {
  MCC_ASSIGN_OR_RETURN(const Layout layout,
                       ParseLayout(absl::GetFlag(FLAGS_layout)));
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::InvalidArgumentError("--out is required");
  if (absl::GetFlag(FLAGS_layout) == "serial") {
    return Train(layout, nullptr, 0, absl::StrCat(out, ".0"));
  }
  // RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as tools/launch sets them.
  mcc::comm::GroupOptions options;
  options.timeout = absl::Seconds(60);
  MCC_ASSIGN_OR_RETURN(mcc::comm::World world,
                       mcc::comm::InitWorldFromEnvironment(options));
  if (world.group->size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout ", absl::GetFlag(FLAGS_layout),
                     " runs on 2 processes, not ", world.group->size()));
  }
  parallel::ParallelSizes sizes;
  sizes.pipeline = layout.pipeline;
  MCC_ASSIGN_OR_RETURN(auto state,
                       parallel::ParallelState::Create(world.group, sizes));
  const int rank = world.group->rank();
  return Train(layout, state.get(), rank, absl::StrCat(out, ".", rank));
}

}  // namespace
}  // namespace tiny_lm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = tiny_lm::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "train_tiny_lm: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
