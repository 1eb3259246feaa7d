#ifndef TRAINING_TESTING_TRAIN_TEST_UTIL_H_
#define TRAINING_TESTING_TRAIN_TEST_UTIL_H_

// A small training loop (tiny GPT, fixed synthetic batches, model + DDP +
// optimizer wired as the train binary wires them) for the optimizer and
// data-parallel tests, serial or in real processes.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/dtype.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/stage_model.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/fsdp/sharding_strategy.h"
#include "parallel/linear.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline/layer_split.h"
#include "parallel/pipeline/pipeline_executor.h"

namespace mcc {
namespace optim {
namespace testing {

gpt::GPTConfig TinyConfig();
// Micro-batch `index` of step `step`: 2 sequences of config.seq_length.
gpt::MicroBatch FixedBatch(const gpt::GPTConfig& config, int step, int index);
// Cuts each sequence of `batch` into documents of lengths 3, 7, 1, 5, 9
// (cycling, from a place set by the sequence and `index`): document_start,
// and position_ids restarting at each document.
void PackDocuments(gpt::MicroBatch* batch, int index);

struct TrainOptions {
  gpt::GPTConfig model = TinyConfig();
  bool sequence_parallel = false;
  // MoE over the ParallelState's expert groups (EP / ETP from its sizes),
  // tokens moved by all-to-all (else all-gather).
  bool expert_layout = false;
  bool moe_alltoall = false;
  DType dtype = DType::kFloat32;
  bool use_ddp = true;  // False: model and optimizer only (serial).
  data_parallel::DdpConfig ddp;
  // optim_grads or optim_grads_params: the sharded wrapper instead of the
  // DDP (ddp.use_distributed_optimizer is then ignored); others: the DDP.
  fsdp::ShardingStrategy sharding = fsdp::ShardingStrategy::kNoShard;
  OptimizerConfig optimizer;
  LrScheduleConfig lr;
  int steps = 10;
  int global_microbatches = 4;  // Split evenly over DP.
  // TrainerOptions::pack_expert_weights (--moe-pack-expert-weights).
  bool pack_expert_weights = false;
  // Steps (0-based) after whose gradient sync every rank writes inf into
  // element 0 of the first parameter's gradient.
  std::vector<int> inject_inf_steps;
  // Only on this pipeline stage (-1: every stage).
  int inject_inf_stage = -1;
  // Check weight hashes over every replica group (DP, TP, CP, the tied
  // embedding's stages) every this many steps (0: never).
  int weight_hash_interval = 0;
  // Compare the reduced gradients over the replica groups before the
  // optimizer step every this many steps (0: never).
  int grad_consistency_interval = 0;
  // A test fault: after step `corrupt_step` (0-based), global rank
  // `corrupt_rank` sets element 0 of its parameter named
  // `corrupt_weight` to 0.125 (empty: none).
  std::string corrupt_weight;
  int corrupt_rank = -1;
  int corrupt_step = 0;
  // Pipeline parallelism over state->pipeline() (its size must match
  // pipeline.pipeline_size; num_layers is taken from the model).
  pipeline::PipelineConfig pipeline;
  pipeline::PipelineOptions schedule;
  // Test hook: the executor moves activations and gradients through this
  // group (the same ranks as state->pipeline(), e.g. the NCCL-like wrapper
  // of core/comm/nccl_like_p2p_group.h) instead; null: state->pipeline().
  comm::ProcessGroup* pipeline_p2p_group = nullptr;
  // Context parallelism over state->context() when its size is above 1
  // (batches stay whole; the model takes its chunks): how attention
  // crosses the group.
  parallel::LayerContext::CpCommType cp_comm_type =
      parallel::LayerContext::CpCommType::kP2P;
  // Packed documents (PackDocuments below) in every micro-batch.
  bool packed_documents = false;
};

struct TrainResult {
  std::vector<double> loss;  // Mean over the global batch, per step.
  std::vector<StepInfo> steps;
  int max_in_flight = 0;     // Most micro-batches held at once on this stage.
  int max_held_outputs = 0;  // Most sent forward outputs held at once.
  // Sharded data parallelism: backward opens of a unit kept open by a
  // pending weight gradient (FsdpStats::split_backward_opens): the split
  // backward ran under ZeRO-2/3.
  int64_t split_backward_opens = 0;
  // The last step's parameter all-gather waits (overlap_param_gather).
  data_parallel::ParamGatherTrace param_gather;
  int num_buckets = 0;
};

// Trains on `state`'s groups (null: one process). Every rank returns the
// same result.
absl::StatusOr<TrainResult> Train(const TrainOptions& options,
                                  parallel::ParallelState* state);

// The mean of `local` over the data-parallel group (null: local itself),
// kept to about fp64 precision.
absl::StatusOr<double> MeanOverDp(double local, comm::ProcessGroup* dp);

// Relative difference |a - b| / |b|.
double RelDiff(double a, double b);

// Writes/reads a result as text (loss, norm, skipped, scale per line).
absl::Status WriteResult(const std::string& path, const TrainResult& r);
absl::StatusOr<TrainResult> ReadResult(const std::string& path);
std::string TmpPath(const std::string& name);

}  // namespace testing
}  // namespace optim
}  // namespace mcc

#endif  // TRAINING_TESTING_TRAIN_TEST_UTIL_H_
