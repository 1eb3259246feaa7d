#ifndef PARALLEL_FSDP_FULLY_SHARDED_DATA_PARALLEL_H_
#define PARALLEL_FSDP_FULLY_SHARDED_DATA_PARALLEL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/comm/process_group.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/flat_layout.h"
#include "parallel/fsdp/sharding_strategy.h"
#include "parallel/model.h"

namespace mcc {
namespace fsdp {

// How training::WrapDataParallel distributes a model over data-parallel
// ranks (--data-parallel-sharding-strategy): no_shard and optim by the
// replicated DistributedDataParallel, optim_grads and optim_grads_params
// by FullyShardedDataParallel.
struct FsdpConfig {
  ShardingStrategy strategy = ShardingStrategy::kOptimGradsParams;
  // no_shard and optim run Megatron's DDP with these settings
  // (use_distributed_optimizer follows the strategy);
  // average_in_collective applies to every strategy.
  data_parallel::DdpConfig ddp;
  // optim_grads_params: gather the next unit's parameters while the current
  // one computes, with at most `max_prefetched_units` gathered ahead of
  // use, so parameter memory stays 1/DP plus the units in use (one, or two
  // nested: a tied model's embedding stays open through the backward) plus
  // the prefetched one.
  bool prefetch = true;
  int max_prefetched_units = 1;
  // Record FsdpEvents (for overlap tests and traces).
  bool record_trace = false;
};

// One timestamped step of the sharded strategies' schedule.
struct FsdpEvent {
  enum Kind {
    kGatherLaunched,  // A unit's parameter all-gather was issued.
    kGatherDone,      // ... and waited for before the unit computed.
    kForwardBegin,
    kForwardEnd,
    kBackwardBegin,
    kBackwardEnd,
    kReduceScatterLaunched,
    kReleased,  // A unit's gathered parameters were freed.
  };
  Kind kind;
  int unit = 0;
  absl::Time time;
  bool prefetch = false;  // kGatherLaunched ahead of the unit's use.
  // kGatherDone: the data had arrived before the unit asked for it (the
  // gather ran entirely behind other work).
  bool ready = false;
  int64_t bytes = 0;  // The allocator's current bytes on this device.
};

struct FsdpStats {
  int gathered_units = 0;       // Now.
  int peak_gathered_units = 0;  // Since the last ResetStats.
  int64_t gathers = 0;
  int64_t prefetched_gathers = 0;
  // Gathers whose data had arrived when their unit first waited for them.
  int64_t gathers_ready_on_use = 0;
  int64_t reduce_scatters = 0;
  // Backward opens of a unit whose gradient buffer a pending W kept alive
  // (split backward; see AllowsSplitBackward).
  int64_t split_backward_opens = 0;
};

// The sharded implementation of the data-parallel interface
// (parallel/data_parallel/data_parallel.h), as Megatron's custom FSDP, over
// a model split into units (the embeddings, each transformer layer, the
// head), driven by the model's unit hooks (parallel/model.h).
//
// optim_grads and optim_grads_params keep, per unit, a flat fp32 gradient
// shard of 1/DP and an fp32 main-parameter shard (which the optimizer
// updates in place as its main copy), laid out as a FlatLayout: a unit's
// full fp32 gradient buffer exists only while its backward runs and is
// reduce-scattered into the shard as soon as the unit's backward ends
// (every micro-batch). optim_grads keeps whole parameters in the model
// dtype, all-gathered from the updated shards after each optimizer step;
// optim_grads_params keeps none: a unit's parameters are all-gathered in
// the model dtype just before its forward and again before its backward,
// and freed after, while the next unit's gather (in the order recorded
// over the previous step) runs ahead. (no_shard and optim are the
// replicated DistributedDataParallel.)
//
// Mixture of experts: a unit's expert weights (Parameter::expert_parallel)
// form a second flat part of it, sharded, reduce-scattered (scaled by 1/DP,
// then summed) and gathered over the expert-data-parallel group
// (config.ddp.expert_data; under HSDP its instance, the reduced shard then
// summed across instances), while the rest shards over DP as above; the
// unit's hooks gather and reduce both parts.
//
// Pipeline parallelism: one wrapper serves every model chunk of this rank
// (one pipeline stage, or several virtual stages of an interleaved
// schedule), their units numbered one after another. Each chunk's unit is
// gathered for each micro-batch's forward and again for its backward (and
// released between them under ZeRO-3 unless the recorded order of the last
// step says it comes next), whatever the schedule interleaves; its
// gradients are reduce-scattered into the shard after every micro-batch's
// backward of that unit, so gradient memory stays 1/DP. Every DP rank of a
// stage runs the same schedule, so the gathers and reduce-scatters match
// over the DP group. A tied word embedding held by the first and the last
// stage (Parameter::shared_with_other_stage) has its shard gradients summed
// by SyncSharedGradients after FinishGradSync.
//
// Under these strategies parameters' `value` (optim_grads_params) and
// `main_grad` are undefined outside their unit's compute: use ZeroGrads,
// FinishGradSync and FinalizeGradients here instead of the model's, and
// GatherFullParams around code that reads whole parameters (checkpoints).
class FullyShardedDataParallel : public parallel::UnitHooks,
                                 public data_parallel::DataParallel {
 public:
  // `params`: every parameter (the DDP's order); `units`: the same
  // parameters grouped per unit in forward order, each in exactly one. dp
  // may be null (DP 1); tp is the group sequence-parallel gradients are
  // summed over (may be null). All parameters share one dtype and one
  // device, which holds the flat shards and buffers (the groups'
  // GroupOptions::device must be that device).
  static absl::StatusOr<std::unique_ptr<FullyShardedDataParallel>> Create(
      const ParameterList& params, const std::vector<ParameterList>& units,
      comm::ProcessGroup* dp, comm::ProcessGroup* tp, FsdpConfig config);
  // config.strategy must shard gradients (optim_grads or
  // optim_grads_params); InvalidArgument otherwise.
  //
  // Wrap: a model's parameters and units, its TP group, and installs (next
  // to any hooks already there) this object as unit hooks, which the
  // destructor removes. The model is not owned and must outlive the
  // wrapper.
  static absl::StatusOr<std::unique_ptr<FullyShardedDataParallel>> Wrap(
      parallel::Model* model, comm::ProcessGroup* dp, FsdpConfig config);
  // Wrap over several chunks of one rank (pipeline stages or virtual
  // stages, in the pipeline's chunk order): their units are numbered one
  // after another (chunk 0's first), each chunk's hooks offset into them.
  // The chunks share one TP group (the first's is used).
  static absl::StatusOr<std::unique_ptr<FullyShardedDataParallel>> Wrap(
      const std::vector<parallel::Model*>& models, comm::ProcessGroup* dp,
      FsdpConfig config);
  ~FullyShardedDataParallel() override;

  // DataParallel (see data_parallel.h for the step's order).
  absl::StatusOr<std::unique_ptr<optim::Optimizer>> CreateOptimizer(
      const optim::OptimizerConfig& config,
      const optim::OptimizerGroups& groups) override;
  absl::Status BeginStep() override;
  absl::Status FinishParamGather() override;
  void ZeroGrads() override;  // Also starts recording the step's unit order.
  // The sharded strategies reduce every micro-batch's gradients.
  void set_is_last_microbatch(bool) override {}
  absl::Status FinishGradSync() override;
  // Sums over `embedding_group` the gradients of parameters shared with
  // another pipeline stage: each such parameter's whole gradient is
  // assembled from the DP shards (an all-reduce over DP), summed over the
  // group and written back into this rank's pieces. Collective over DP and
  // embedding_group where this wrapper holds such parameters; both stages
  // must hold them in the same order. After FinishGradSync.
  absl::Status SyncSharedGradients(
      comm::ProcessGroup* embedding_group) override;
  absl::Status FinalizeGradients() override;
  absl::Status GatherFullParams() override;
  absl::Status ScatterFullParams() override;
  absl::Status ReleaseFullParams() override;
  bool shards_gradients() const override { return true; }
  bool holds_whole_reduced_gradients() const override { return false; }
  absl::StatusOr<Tensor> HeldGradient(const Parameter& param) const override;
  const ParameterList& parameters() const override { return params_; }
  comm::ProcessGroup* dp_group() const override { return dp_; }
  std::string Describe() const override;

  // parallel::UnitHooks.
  // A split backward (zero-bubble schedules: B now, W later) runs here: the
  // model closes a unit's backward (AfterBackward) only after its W, and a
  // unit stays open (its gathered parameters kept, under ZeRO-3, and its
  // full fp32 gradient buffer alive) while any micro-batch's W on it is
  // pending, other micro-batches' forwards and B's opening it again in
  // between (counted, not re-gathered or re-allocated). The buffer is
  // reduce-scattered once the unit's last pending W has run. Extra memory:
  // per unit with pending W's, its full gradient (and, ZeRO-3, its
  // gathered parameters) instead of 1/DP of them: at most the units of the
  // chunks whose W's the schedule defers (ZB-H1's stage s: s micro-batches
  // of every unit, all in one buffer). stats().split_backward_opens counts
  // the backward opens that found the unit's buffer still alive.
  bool AllowsSplitBackward() const override { return true; }
  absl::Status BeforeForward(int unit) override;
  absl::Status AfterForward(int unit) override;
  absl::Status BeforeBackward(int unit) override;
  absl::Status AfterBackward(int unit) override;

  ShardingStrategy strategy() const { return config_.strategy; }
  const FsdpConfig& config() const { return config_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  // The layout of a unit's dense parameters (part 0) or of its expert
  // weights (part 1, where it holds any).
  int num_parts(int unit) const {
    return static_cast<int>(units_[unit].parts.size());
  }
  const data_parallel::FlatLayout& layout(int unit, int part = 0) const {
    return units_[unit].parts[part].layout;
  }
  const std::vector<FsdpEvent>& trace() const { return trace_; }
  void ClearTrace() { trace_.clear(); }
  const FsdpStats& stats() const { return stats_; }
  void ResetStats();

 private:
  // One flat layout of a unit's parameters with its shards and buffers:
  // the dense parameters, sharded over DP (or the HSDP instance), and,
  // where the unit holds mixture-of-experts weights (expert_parallel), a
  // second part of them sharded over the expert-data-parallel group.
  struct Part {
    bool expert = false;
    data_parallel::FlatLayout layout;
    std::vector<data_parallel::FlatPiece> pieces;  // This rank's.
    Tensor main_shard;  // fp32 [shard]: the optimizer's main copy.
    Tensor grad_shard;  // fp32 [shard]: reduced gradients of the step.
    Tensor full;        // Model dtype [padded]: the gathered parameters.
    Tensor send;        // The gather's input while it runs.
    std::shared_ptr<comm::Work> gather;
    Tensor full_grad;  // fp32 [padded] while a backward is open.
  };
  struct Unit {
    std::vector<Part> parts;  // The dense part, then the expert one if any.
    bool resident = false;    // `full` holds (or is receiving) the values.
    int open = 0;             // Unit hook calls open (forward and backward).
    int open_backward = 0;
  };
  struct PendingReduce {
    int unit = 0;
    int part = 0;
    std::shared_ptr<comm::Work> work;
    Tensor in, out;
  };
  struct Request {
    int unit = 0;
    bool backward = false;
    bool operator==(const Request& o) const {
      return unit == o.unit && backward == o.backward;
    }
  };

  // Forwards one chunk's unit hooks to the wrapper with the chunk's first
  // unit added.
  class ChunkHooks : public parallel::UnitHooks {
   public:
    ChunkHooks(FullyShardedDataParallel* owner, int offset)
        : owner_(owner), offset_(offset) {}
    absl::Status BeforeForward(int unit) override {
      return owner_->BeforeForward(offset_ + unit);
    }
    absl::Status AfterForward(int unit) override {
      return owner_->AfterForward(offset_ + unit);
    }
    absl::Status BeforeBackward(int unit) override {
      return owner_->BeforeBackward(offset_ + unit);
    }
    absl::Status AfterBackward(int unit) override {
      return owner_->AfterBackward(offset_ + unit);
    }
    bool AllowsSplitBackward() const override {
      return owner_->AllowsSplitBackward();
    }

   private:
    FullyShardedDataParallel* owner_;
    int offset_;
  };

  FullyShardedDataParallel() = default;
  bool shards_params() const {
    return config_.strategy == ShardingStrategy::kOptimGradsParams;
  }
  absl::Status CheckUnit(int unit, const char* hook) const;
  absl::Status Open(int unit, bool backward);
  absl::Status Close(int unit, bool backward);
  // Issues the all-gather of a unit's parameters from the main shards.
  absl::Status LaunchGather(int unit, bool prefetch);
  absl::Status WaitGather(int unit);
  absl::Status Release(int unit);
  void BindValues(int unit);
  absl::Status LaunchReduceScatter(int unit);
  // Adds finished reduce-scatters into the gradient shards, in issue order,
  // waiting for the oldest until at most `max_pending` remain in flight.
  absl::Status DrainReductions(size_t max_pending);
  // The reductions in flight of the last unit that launched any (one per
  // part); at least 1.
  size_t PendingOfLastUnit() const;
  // The unit the recorded order expects after request k (-1: none known).
  int NextUnit(int64_t k, const Request& now) const;
  absl::Status AfterOptimizerStep();
  void Trace(FsdpEvent::Kind kind, int unit, bool prefetch = false,
             bool ready = false);
  int ResidentUnits() const;
  int IdleResidentUnits() const;  // Gathered but not in use.

  FsdpConfig config_;
  // HSDP: each unit's gradient shard summed over the instances.
  absl::Status ReduceAcrossInstances();
  // Where a part's shards split and (HSDP) its reduced shard is summed.
  comm::ProcessGroup* ShardGroupOf(const Part& part) const {
    return part.expert ? expert_ : shard_;
  }
  comm::ProcessGroup* CrossGroupOf(const Part& part) const {
    return part.expert ? expert_cross_ : cross_;
  }

  comm::ProcessGroup* dp_ = nullptr;
  // Where shards split: dp_, or under HSDP (config.ddp.hybrid) this rank's
  // instance; cross_ (HSDP only) all-reduces each reduced gradient shard.
  comm::ProcessGroup* shard_ = nullptr;
  comm::ProcessGroup* cross_ = nullptr;
  // The expert-data-parallel group (config.ddp.expert_data) the expert
  // parts shard over, or under HSDP its instance (expert_cross_ then sums
  // their reduced shards); null: one rank.
  comm::ProcessGroup* expert_ = nullptr;
  comm::ProcessGroup* expert_cross_ = nullptr;
  comm::ProcessGroup* tp_ = nullptr;
  // Set by Wrap: the chunks and the hooks installed on them, to detach.
  std::vector<parallel::Model*> models_;
  std::vector<std::unique_ptr<ChunkHooks>> chunk_hooks_;
  DType dtype_ = DType::kFloat32;
  Device device_ = Device::CPU();  // Of the parameters and every buffer.
  ParameterList params_;
  std::vector<Unit> units_;
  std::deque<PendingReduce> pending_;
  // The order of unit requests (Before* calls) of the last complete step
  // and of the current one; prefetching follows the last while the current
  // agrees with it.
  std::vector<Request> order_, recording_;
  int64_t request_index_ = 0;
  bool order_valid_ = false;
  int expected_next_ = -1;  // The unit the order says comes next.
  bool pinned_ = false;     // GatherFullParams: release nothing.
  std::vector<FsdpEvent> trace_;
  FsdpStats stats_;
};

}  // namespace fsdp
}  // namespace mcc

#endif  // PARALLEL_FSDP_FULLY_SHARDED_DATA_PARALLEL_H_
