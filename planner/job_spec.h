#ifndef PLANNER_JOB_SPEC_H_
#define PLANNER_JOB_SPEC_H_

#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "models/gpt/gpt_config.h"
#include "parallel/pipeline/schedule_table.h"
#include "planner/device_spec.h"

namespace mcc {
namespace planner {

// What stays fixed while the planner varies the layout: the model, the
// batch, the precision and optimizer, train's communication settings and
// the cluster.
struct JobSpec {
  gpt::GPTConfig model;  // Its recompute fields are ignored (the layout's).
  DType dtype = DType::kFloat32;  // Weights and activations.
  int64_t global_batch = 1;       // Sequences per step.
  bool adam = true;               // AdamW (2 states) or SGD (momentum).
  // Bytes per parameter of the optimizer's fp32-by-default copies
  // (--use-precision-aware-optimizer with --main-params-dtype,
  // --exp-avg-dtype, --exp-avg-sq-dtype): 2 for bf16/fp16. The main copy
  // exists only for 16-bit weights.
  int main_params_bytes = 4;
  int exp_avg_bytes = 4;
  int exp_avg_sq_bytes = 4;
  // --pipeline-schedule-file's table, for layouts whose schedule is kFile
  // (it fixes the pipeline size, chunks and micro-batch count).
  std::shared_ptr<const pipeline::ScheduleTable> schedule_table;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  bool overlap_p2p = true;
  // TP collectives split into chunks run behind the GEMMs that produce or
  // consume them (Megatron's --tp-comm-overlap; train does not do it).
  bool overlap_tp_comm = false;
  // Each norm, rotary embedding and activation is one kernel that reads and
  // writes the activations once (Megatron with its fused kernels, this
  // project's train, torch.compile). False for eager PyTorch running the
  // Llama block as torchtitan writes it, where each is several kernels with
  // fp32 intermediates (EagerElementwiseBytes in step_time_model.cc).
  bool fused_elementwise = true;
  int64_t bucket_bytes = 40000000LL * 4;  // train's --ddp-bucket-size x 4
  // A dropless mixture of experts under expert parallelism: the busiest EP
  // rank's expert rows over the mean (planner/moe_model.h). An assumption,
  // not a measurement: a router balanced by its aux loss or expert bias
  // stays near it; an unbalanced one can reach EP.
  double moe_dropless_imbalance = 1.2;
  ClusterSpec cluster;
};

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_JOB_SPEC_H_
