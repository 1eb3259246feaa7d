#ifndef TOOLS_PLAN_JOB_H_
#define TOOLS_PLAN_JOB_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "models/gpt/gpt_config.h"
#include "planner/job_spec.h"
#include "planner/layout.h"
#include "training/train_config.pb.h"

namespace mcc {
namespace tools {

// What train's own flags (in tools/train.cc, not the shared model flags)
// say about the step, for the planner.
struct TrainSettings {
  int64_t global_batch = 1;
  planner::ZeroStage zero = planner::ZeroStage::kNone;
  bool adam = true;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  bool overlap_p2p = true;
  int64_t bucket_bytes = 40000000LL * 4;
  // --use-precision-aware-optimizer's state dtypes, bytes a parameter.
  int main_params_bytes = 4;
  int exp_avg_bytes = 4;
  int exp_avg_sq_bytes = 4;
  // --pipeline-schedule-file's table, read and checked.
  std::shared_ptr<const pipeline::ScheduleTable> schedule_table;
};

// The optimizer state's precision (--use-precision-aware-optimizer and its
// dtype flags) and the --pipeline-schedule-file table for `microbatches`
// micro-batches, from train's own parsers, onto *settings; their errors
// name the flag.
absl::Status ReadPrecisionAndScheduleFile(const training::TrainConfig& config,
                                          int microbatches,
                                          TrainSettings* settings);

// The cluster: --device a100/h100/h200 from the shipped table, or cpu,
// measured now for `devices_per_node` ranks sharing this machine (about two
// seconds), each with `num_threads` kernel threads (0: train's default,
// cores / ranks). The error names --device.
absl::StatusOr<planner::ClusterSpec> MakeCluster(
    const std::string& device, int devices_per_node, int nodes,
    const gpt::GPTConfig& model, DType dtype, int num_threads = 0);

// The model dtype the shared flags ask for (--bf16, --fp16, else fp32).
DType DTypeFromConfig(const training::TrainConfig& config);

// The layout the shared parallel flags describe for `world` ranks
// (--tensor-model-parallel-size, --sequence-parallel, pipeline and virtual
// stages, --context-parallel-size, --micro-batch-size, recomputation,
// --pipeline-schedule and --pipeline-schedule-file,
// --decoder-first/last-pipeline-num-layers,
// --num-distributed-optimizer-instances); DP is what remains. The error names
// the flag that does not divide.
absl::StatusOr<planner::Layout> LayoutFromTrainConfig(
    const training::TrainConfig& config, int world, planner::ZeroStage zero);

planner::JobSpec MakeJobSpec(const gpt::GPTConfig& model, DType dtype,
                             const TrainSettings& settings,
                             const planner::ClusterSpec& cluster);

}  // namespace tools
}  // namespace mcc

#endif  // TOOLS_PLAN_JOB_H_
