#ifndef PARALLEL_DATA_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_
#define PARALLEL_DATA_PARALLEL_DISTRIBUTED_DATA_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/comm/process_group.h"
#include "core/parameter.h"
#include "core/tensor.h"

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
};

// One bucket: a contiguous stretch of the gradient buffer (and, under the
// distributed optimizer, of the parameter buffer) that is reduced by one
// collective. Parameters are laid out in reverse model order, the order in
// which backward completes their gradients.
struct Bucket {
  int index = 0;
  std::vector<Parameter*> params;  // In layout order.
  std::vector<int64_t> offsets;    // Element offset of each param here.
  int64_t numel = 0;               // Elements used (with alignment gaps).
  int64_t padded_numel = 0;        // Multiple of 16 x DP.
  Tensor grad_data;                // fp32 [padded_numel]
  Tensor param_data;               // model dtype [padded_numel]; distopt only
  int dp_size = 1;
  // Elements of each rank's shard under the distributed optimizer.
  int64_t shard_numel() const { return padded_numel / dp_size; }
};

// A piece of one parameter that this rank updates: the whole parameter
// without the distributed optimizer, else the intersection of the parameter
// with this rank's shard of its bucket.
struct ParamShard {
  std::shared_ptr<Parameter> param;
  int64_t begin = 0;  // Element range of the flattened (TP-local) parameter.
  int64_t end = 0;
  int bucket = 0;
  int64_t bucket_offset = 0;  // Where `begin` sits in its bucket.
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

// Data parallelism as Megatron's DistributedDataParallel: every
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
class DistributedDataParallel {
 public:
  // dp may be null (no data parallelism: no communication). Every parameter
  // must be distinct and all on one device, where the bucket buffers are
  // allocated (dp's GroupOptions::device must be that device); under the
  // distributed optimizer all must share a dtype.
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Create(
      const ParameterList& params, comm::ProcessGroup* dp, DdpConfig config);
  ~DistributedDataParallel();

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
  void set_is_last_microbatch(bool last) { is_last_microbatch_ = last; }
  bool is_last_microbatch() const { return is_last_microbatch_; }

  // After the last micro-batch's backward: launches the buckets not yet
  // launched and waits for all. Gradients are then averaged over DP (under
  // the distributed optimizer only in this rank's shards).
  absl::Status FinishGradSync();
  void ZeroGrads();

  // Distributed optimizer: all-gathers every bucket's updated parameter
  // shards (launched in forward order); FinishParamGather waits. Without
  // the distributed optimizer both do nothing.
  absl::Status StartParamGather();
  absl::Status FinishParamGather();
  // Waits only for the buckets that hold these parameters (a forward
  // pre-hook, so later layers' gathers overlap earlier layers' compute).
  absl::Status WaitParamGather(const ParameterList& params);
  const ParamGatherTrace& param_gather_trace() const { return param_trace_; }

  // The pieces of parameters this rank updates (see ParamShard).
  const std::vector<ParamShard>& local_shards() const { return shards_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const ParameterList& parameters() const { return params_; }
  const DdpConfig& config() const { return config_; }
  // The parameters' device, which holds every buffer.
  Device device() const { return device_; }
  comm::ProcessGroup* dp_group() const { return dp_; }
  int dp_size() const { return dp_ == nullptr ? 1 : dp_->size(); }
  int dp_rank() const { return dp_ == nullptr ? 0 : dp_->rank(); }
  const GradSyncTrace& last_trace() const { return trace_; }

 private:
  DistributedDataParallel() = default;
  absl::Status LaunchBucket(int b, bool from_hook);
  void ResetReady();
  void BeginTrace();

  DdpConfig config_;
  comm::ProcessGroup* dp_ = nullptr;
  ParameterList params_;
  Device device_ = Device::CPU();
  Tensor grad_buffer_;   // fp32, all buckets back to back.
  Tensor param_buffer_;  // distopt only.
  std::vector<Bucket> buckets_;
  std::vector<ParamShard> shards_;
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
