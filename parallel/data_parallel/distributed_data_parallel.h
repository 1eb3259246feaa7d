#ifndef PARALLEL_DATA_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_
#define PARALLEL_DATA_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/comm/process_group.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/flat_layout.h"
#include "parallel/data_parallel/hybrid_sharding.h"
#include "parallel/model.h"

namespace mcc {
namespace data_parallel {

// Megatron's DistributedDataParallelConfig, with the flags beside each.
struct DdpConfig {
  // A bucket closes once it holds at least this many bytes of fp32
  // gradients (--ddp-bucket-size, in elements there: 40M by default).
  int64_t bucket_size_bytes = 40000000LL * 4;
  // Reduce a bucket during backward as soon as its last gradient is ready
  // (--overlap-grad-reduce); otherwise everything is reduced in
  // FinishGradSync().
  bool overlap_grad_reduce = false;
  // Reduce-scatter instead of all-reduce: each rank keeps the reduced
  // gradients of its 1/DP shard of every bucket (--use-distributed-optimizer).
  bool use_distributed_optimizer = false;
  // Average with the collective's own average (ReduceOp::kAvg) instead of
  // scaling by 1/DP before a sum.
  bool average_in_collective = false;
  // Under the distributed optimizer: StartParamGather() returns at once and
  // FinishParamGather() waits (--overlap-param-gather).
  bool overlap_param_gather = false;
  // --num-distributed-optimizer-instances (hybrid_sharding.h): with the
  // distributed optimizer, shards live within an instance and the
  // reduced shard is all-reduced across instances. Default: none.
  HybridSharding hybrid;
  // Mixture of experts: the expert-data-parallel group (the ranks holding
  // the same experts). Parameters marked expert_parallel go to buckets of
  // their own, reduced (and, under the distributed optimizer, sharded)
  // over it and scaled by 1 / DP like the rest (Megatron's expert
  // buffers). Null: such parameters are refused. Under hybrid, their state
  // shards over hybrid.expert_instance.
  comm::ProcessGroup* expert_data = nullptr;
  // Test-only fault for the consistency checks' tests: FinalizeGradients
  // still takes part in the sequence-parallel all-reduce of the parameter
  // of this name (so no rank waits) but keeps this rank's own partial
  // gradient, as if the reduction were missing here. Empty: none.
  std::string skip_sequence_parallel_reduce_for_testing;
};

// One bucket: a contiguous stretch of the gradient buffer (and, under the
// distributed optimizer, of the parameter buffer) that is reduced by one
// collective, laid out as a FlatLayout over DP shards. Parameters are laid
// out in reverse model order, the order in which backward completes their
// gradients.
struct Bucket {
  int index = 0;
  // Expert parameters' bucket: reduced and sharded over the
  // expert-data-parallel group (DdpConfig::expert_data).
  bool expert = false;
  FlatLayout layout;
  Tensor grad_data;   // fp32 [layout.padded_numel]
  Tensor param_data;  // Model dtype [layout.padded_numel]; distopt only.
  // The pieces of the bucket's parameters this rank updates: all of them
  // whole, or under the distributed optimizer those in its shard.
  std::vector<FlatPiece> local_pieces;
};

// When each bucket's collective was launched during the last gradient sync
// (for overlap checks and traces).
struct GradSyncTrace {
  std::vector<absl::Time> launched;        // Per bucket; InfinitePast if never.
  std::vector<bool> launched_in_backward;  // From the grad-ready hook.
  absl::Time all_grads_ready = absl::InfinitePast();  // Last hook call.
  // Per bucket: whether its collective had already completed when the last
  // gradient became ready (reduction overlapped with backward).
  std::vector<bool> done_when_all_ready;
  absl::Time finish_called = absl::InfinitePast();  // FinishGradSync().
  absl::Time finished = absl::InfinitePast();       // All buckets done.
};

// How the distributed optimizer's parameter all-gathers were waited for in
// the last step (with overlap_param_gather, from the forward's hooks).
struct ParamGatherTrace {
  // Buckets in the order a forward pre-hook waited for them.
  std::vector<int> waited_in_forward;
  // When the first hook waited: buckets launched and not yet waited for,
  // and of those, how many had not completed (real overlap with forward).
  int pending_at_first_wait = 0;
  int incomplete_at_first_wait = 0;
};

// The replicated implementation of the data-parallel interface
// (data_parallel.h), as Megatron's DistributedDataParallel: every
// parameter's main_grad becomes a view into a contiguous fp32 bucket
// buffer; buckets are all-reduced (reduce-scattered under the distributed
// optimizer) and averaged over the data-parallel group, during backward
// when overlap is on. Gradient accumulation over micro-batches communicates
// only on the micro-batch marked last (set_is_last_microbatch, like
// Megatron's no_sync).
//
// Under the distributed optimizer the parameters' values become views into
// a contiguous buffer of the same layout, so the updated shards can be
// all-gathered in place after the optimizer step.
class DistributedDataParallel : public DataParallel {
 public:
  // dp may be null (no data parallelism: no communication); tp (may be
  // null) is the group sequence-parallel gradients are summed over by
  // FinalizeGradients. Every parameter must be distinct and all on one
  // device, where the bucket buffers are allocated (dp's
  // GroupOptions::device must be that device); under the distributed
  // optimizer all must share a dtype.
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      const ParameterList& params, comm::ProcessGroup* dp, DdpConfig config,
      comm::ProcessGroup* tp = nullptr);
  // Over models (a whole model, or one rank's pipeline chunks): their
  // parameters in order, the first model's tensor group as tp, and, next to
  // any hooks already installed, the grad-ready hook on every model and
  // (--overlap-param-gather with the distributed optimizer) a unit hook
  // that waits for each unit's parameter gather before its forward. The
  // destructor removes them; the models must outlive the wrapper.
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Wrap(
      const std::vector<parallel::Model*>& models, comm::ProcessGroup* dp,
      DdpConfig config);
  ~DistributedDataParallel() override;

  // DataParallel.
  absl::Status BeginStep() override;
  absl::Status FinishParamGather() override;
  void ZeroGrads() override;
  void set_is_last_microbatch(bool last) override {
    is_last_microbatch_ = last;
  }
  // After the last micro-batch's backward: launches the buckets not yet
  // launched and waits for all. Gradients are then averaged over DP (under
  // the distributed optimizer only in this rank's shards).
  absl::Status FinishGradSync() override;
  absl::Status FinalizeGradients() override;
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> CreateOptimizer(
      const optim::OptimizerConfig& config,
      const optim::OptimizerGroups& groups) override;
  // Parameters stay whole: gathering waits for the distributed optimizer's
  // all-gathers; there is no separate copy to scatter into or release.
  absl::Status GatherFullParams() override { return FinishParamGather(); }
  absl::Status ScatterFullParams() override { return absl::OkStatus(); }
  absl::Status ReleaseFullParams() override { return absl::OkStatus(); }
  bool shards_gradients() const override { return false; }
  bool holds_whole_reduced_gradients() const override {
    return !config_.use_distributed_optimizer;
  }
  const ParameterList& parameters() const override { return params_; }
  comm::ProcessGroup* dp_group() const override { return dp_; }
  std::string Describe() const override;

  // The model's grad-ready hook: marks the parameters ready (only on the
  // last micro-batch) and launches each bucket whose gradients are all
  // ready, when overlap is on.
  absl::Status OnGradsReady(const std::vector<Parameter*>& ready);
  std::function<absl::Status(const std::vector<Parameter*>&)> GradReadyHook() {
    return [this](const std::vector<Parameter*>& ready) {
      return OnGradsReady(ready);
    };
  }

  // Whether the next micro-batch is the last of the step (default true).
  bool is_last_microbatch() const { return is_last_microbatch_; }

  // Distributed optimizer: all-gathers every bucket's updated parameter
  // shards (launched in forward order); FinishParamGather waits. Without
  // the distributed optimizer both do nothing.
  absl::Status StartParamGather();
  // Waits only for the buckets that hold these parameters (a forward
  // pre-hook, so later layers' gathers overlap earlier layers' compute).
  absl::Status WaitParamGather(const ParameterList& params);
  const ParamGatherTrace& param_gather_trace() const { return param_trace_; }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const DdpConfig& config() const { return config_; }
  // The parameters' device, which holds every buffer.
  Device device() const { return device_; }
  const GradSyncTrace& last_trace() const { return trace_; }

 private:
  DistributedDataParallel() = default;
  absl::Status LaunchBucket(int b, bool from_hook);
  void ResetReady();
  void BeginTrace();

  DdpConfig config_;
  int shard_size() const { return shard_ == nullptr ? 1 : shard_->size(); }
  int shard_rank() const { return shard_ == nullptr ? 0 : shard_->rank(); }
  // Where a bucket is reduced and its shards split: the expert-data group
  // for expert buckets, else dp_ and shard_.
  comm::ProcessGroup* ReduceGroupOf(const Bucket& b) const {
    return b.expert ? config_.expert_data : dp_;
  }
  comm::ProcessGroup* ShardGroupOf(const Bucket& b) const {
    return b.expert ? config_.hybrid.ExpertShardGroup(config_.expert_data)
                    : shard_;
  }
  // HSDP: where a bucket's reduced shard is summed across instances.
  comm::ProcessGroup* CrossGroupOf(const Bucket& b) const {
    return b.expert ? config_.hybrid.ExpertCrossGroup() : cross_;
  }

  comm::ProcessGroup* dp_ = nullptr;
  // Where the distributed optimizer's shards split: dp_, or under HSDP
  // this rank's instance; cross_ (HSDP only) all-reduces the shard.
  comm::ProcessGroup* shard_ = nullptr;
  comm::ProcessGroup* cross_ = nullptr;
  comm::ProcessGroup* tp_ = nullptr;  // Null when of size 1.
  ParameterList params_;
  // Set by Wrap: the models and the hooks installed on them.
  std::vector<parallel::Model*> models_;
  std::vector<int> grad_ready_hook_ids_;
  std::vector<std::unique_ptr<parallel::UnitHooks>> gather_hooks_;
  Device device_ = Device::CPU();
  Tensor grad_buffer_;   // fp32, all buckets back to back.
  Tensor param_buffer_;  // distopt only.
  std::vector<Bucket> buckets_;
  struct Slot {
    int bucket = 0;
    bool ready = false;
  };
  std::unordered_map<const Parameter*, Slot> slots_;
  std::vector<int> pending_;  // Params not yet ready, per bucket.
  std::vector<std::shared_ptr<comm::Work>> grad_work_;
  std::vector<std::shared_ptr<comm::Work>> param_work_;
  std::vector<Tensor> gather_input_;  // Per bucket: a copy of this shard.
  bool is_last_microbatch_ = true;
  int ready_count_ = 0;
  GradSyncTrace trace_;
  ParamGatherTrace param_trace_;
};

}  // namespace data_parallel
}  // namespace mcc

#endif  // PARALLEL_DATA_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_
