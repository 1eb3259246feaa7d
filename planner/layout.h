#ifndef PLANNER_LAYOUT_H_
#define PLANNER_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace planner {

// How data parallelism shards state, as Megatron's
// --data-parallel-sharding-strategy (ZeRO stage in brackets).
enum class ZeroStage {
  kNone = 0,        // no_shard: whole gradients, optimizer state per rank
  kOptimizer = 1,   // optim: the distributed optimizer
  kGradients = 2,   // optim_grads
  kParameters = 3,  // optim_grads_params
};

enum class Recompute {
  kNone,
  kSelective,  // Megatron's: the core attention
  kFull,
  // torchtitan's 'op' selective checkpointing: keeps attention's and every
  // other matmul's outputs, recomputes the other matmuls and every
  // non-matmul op. The planner models it for comparison; train has no
  // such mode.
  kSelectiveOps,
};

// The pipeline's order of work (train's --pipeline-schedule and
// --pipeline-schedule-file). The planner walks the table the executor builds
// for it (planner/schedule_walk.h).
enum class PipelineSchedule {
  kOneFOneB,      // 1F1B, interleaved with virtual stages (train's default)
  kZeroBubbleH1,  // zb-h1: weight gradients deferred into 1F1B's bubbles
  kFile,          // the job's --pipeline-schedule-file table
  // zbv: two model chunks a stage placed in a V, weight gradients deferred;
  // train runs it over the CPU (gloo) pipeline group only.
  kZeroBubbleV,
};

// One way to run a job: the parallel sizes, sharding, recomputation and
// micro-batch. world = tp x cp x dp x pp.
struct Layout {
  int tp = 1;
  int pp = 1;
  int virtual_stages = 1;  // Model chunks per pipeline rank (interleaving).
  int dp = 1;
  int cp = 1;
  ZeroStage zero = ZeroStage::kNone;
  bool sequence_parallel = false;  // Only meaningful with tp > 1.
  Recompute recompute = Recompute::kNone;
  int64_t micro_batch = 1;
  // Mixture of experts (planner/moe_model.h): expert parallelism over the
  // data-parallel ranks and the experts' tensor parallelism (0: TP's, as
  // Megatron's --expert-tensor-parallel-size). Only with num_experts > 0.
  int ep = 1;
  int etp = 0;

  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  // HSDP (--num-distributed-optimizer-instances): the DP x CP ranks form
  // this many replica groups, each sharding the state (ZeRO >= 1).
  int instances = 1;
  // Percent of the fp32 main weights and optimizer state kept in host memory
  // (--optimizer-cpu-offload with --optimizer-offload-fraction); GPUs only.
  int offload_percent = 0;
  // Megatron's --decoder-first-pipeline-num-layers and
  // --decoder-last-pipeline-num-layers (0: unset): the first (last) stage's
  // decoder layers, the rest split evenly (planner/stage_layers.h).
  int first_stage_layers = 0;
  int last_stage_layers = 0;

  int world() const { return tp * pp * dp * cp; }
  // A stable, parseable name: "tp2sp.pp2v2.dp2.cp1.z1.rnone.mb4", with
  // ".ep2" and ".etp1", then ".szb-h1" (".sfile"), ".i2" (instances) and
  // ".o50" (offload percent), ".first3" and ".last5" (the first and last
  // stages' layers) after it when they are not the defaults.
  std::string Name() const;
};

// Parses Layout::Name()'s form; parts may come in any order and any may be
// left out (defaults above). The error names the part it cannot read.
absl::StatusOr<Layout> ParseLayout(absl::string_view name);

absl::string_view ZeroStageName(ZeroStage zero);  // Megatron's strategy name
// 1f1b/zb-h1/file, as --pipeline-schedule names them.
absl::string_view PipelineScheduleName(PipelineSchedule schedule);
// none/selective/full/ops
absl::string_view RecomputeName(Recompute recompute);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_LAYOUT_H_
