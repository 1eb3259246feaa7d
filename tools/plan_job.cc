#include "tools/plan_job.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "planner/cpu_probe.h"
#include "training/run_options.h"

namespace mcc {
namespace tools {

absl::StatusOr<planner::ClusterSpec> MakeCluster(const std::string& device,
                                                 int devices_per_node,
                                                 int nodes,
                                                 const gpt::GPTConfig& model,
                                                 DType dtype, int num_threads) {
  if (devices_per_node < 1 || nodes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices-per-node (", devices_per_node,
                     ") and --nnodes (", nodes, ") must be positive"));
  }
  planner::ClusterSpec cluster;
  cluster.devices_per_node = devices_per_node;
  cluster.nodes = nodes;
  if (device == "cpu") {
    cluster.device =
        planner::MeasureCpuDevice(model, dtype, devices_per_node, num_threads);
  } else {
    auto spec = planner::ShippedDevice(device);
    if (!spec.ok()) return spec.status();
    cluster.device = *spec;
  }
  return cluster;
}

DType DTypeFromConfig(const training::TrainConfig& config) {
  if (config.bf16()) return DType::kBFloat16;
  if (config.fp16()) return DType::kFloat16;
  return DType::kFloat32;
}

absl::StatusOr<planner::Layout> LayoutFromTrainConfig(
    const training::TrainConfig& config, int world, planner::ZeroStage zero) {
  planner::Layout l;
  l.tp = config.tensor_model_parallel_size();
  l.pp = config.pipeline_model_parallel_size();
  l.cp = config.context_parallel_size();
  l.sequence_parallel = config.sequence_parallel() && l.tp > 1;
  l.micro_batch = config.micro_batch_size();
  l.zero = zero;
  if (config.num_experts() > 0) {
    l.ep = config.expert_model_parallel_size();
    l.etp = config.expert_tensor_parallel_size();
    // Unset, Megatron's ETP is TP's; but the GPT runs its MoE layers whole
    // on every tensor-parallel rank until expert tensor parallelism reaches
    // it: plan what it runs (ETP 1). Change this with the GPT.
    if (l.etp == 0) l.etp = 1;
  }
  const int model_parallel = l.tp * l.pp * l.cp;
  if (model_parallel < 1 || world % model_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world size ", world,
        " is not a multiple of "
        "--tensor-model-parallel-size x --pipeline-model-parallel-size x "
        "--context-parallel-size = ",
        model_parallel));
  }
  l.dp = world / model_parallel;
  const int per_virtual = config.num_layers_per_virtual_pipeline_stage();
  if (per_virtual > 0) {
    const int per_stage = config.num_layers() / l.pp;
    if (per_stage % per_virtual != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--num-layers-per-virtual-pipeline-stage ", per_virtual,
          " does not divide the ", per_stage, " layers of a stage"));
    }
    l.virtual_stages = per_stage / per_virtual;
  } else if (config.pipeline_schedule() == "zbv" && l.pp > 1) {
    // ZB-V with the balanced split: two chunks, each half its stage.
    l.virtual_stages = 2;
  }
  // An uneven split (train has checked the flags).
  l.first_stage_layers = config.decoder_first_pipeline_num_layers();
  l.last_stage_layers = config.decoder_last_pipeline_num_layers();
  if (!config.pipeline_schedule_file().empty()) {
    l.schedule = planner::PipelineSchedule::kFile;
  } else if (config.pipeline_schedule() == "zb-h1") {
    l.schedule = planner::PipelineSchedule::kZeroBubbleH1;
  } else if (config.pipeline_schedule() == "zbv") {
    l.schedule = planner::PipelineSchedule::kZeroBubbleV;
  }
  l.instances = std::max(1, config.num_distributed_optimizer_instances());
  const std::string r = config.recompute_granularity();
  l.recompute = r == "full"        ? planner::Recompute::kFull
                : r == "selective" ? planner::Recompute::kSelective
                                   : planner::Recompute::kNone;
  return l;
}

absl::Status ReadPrecisionAndScheduleFile(const training::TrainConfig& config,
                                          int microbatches,
                                          TrainSettings* settings) {
  auto precision = training::StatePrecisionFromConfig(config);
  if (!precision.ok()) return precision.status();
  settings->main_params_bytes =
      static_cast<int>(DTypeSize(precision->main_params));
  settings->exp_avg_bytes = static_cast<int>(DTypeSize(precision->exp_avg));
  settings->exp_avg_sq_bytes =
      static_cast<int>(DTypeSize(precision->exp_avg_sq));
  if (!config.pipeline_schedule_file().empty()) {
    auto options = training::PipelineOptionsFromConfig(config, microbatches);
    if (!options.ok()) return options.status();
    settings->schedule_table = options->table;
  }
  return absl::OkStatus();
}

planner::JobSpec MakeJobSpec(const gpt::GPTConfig& model, DType dtype,
                             const TrainSettings& s,
                             const planner::ClusterSpec& cluster) {
  planner::JobSpec job;
  job.model = model;
  job.dtype = dtype;
  job.global_batch = s.global_batch;
  job.adam = s.adam;
  job.overlap_grad_reduce = s.overlap_grad_reduce;
  job.overlap_param_gather = s.overlap_param_gather;
  job.overlap_p2p = s.overlap_p2p;
  job.bucket_bytes = s.bucket_bytes;
  job.main_params_bytes = s.main_params_bytes;
  job.exp_avg_bytes = s.exp_avg_bytes;
  job.exp_avg_sq_bytes = s.exp_avg_sq_bytes;
  job.schedule_table = s.schedule_table;
  job.cluster = cluster;
  return job;
}

}  // namespace tools
}  // namespace mcc
