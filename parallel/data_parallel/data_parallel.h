#ifndef PARALLEL_DATA_PARALLEL_DATA_PARALLEL_H_
#define PARALLEL_DATA_PARALLEL_DATA_PARALLEL_H_

// The one data-parallel interface, with two implementations:
//   - replicated (DistributedDataParallel, this folder): every rank holds
//     every parameter; gradients are all-reduced, or reduce-scattered with
//     the distributed optimizer (ZeRO-1), in fp32 buckets;
//   - sharded (FullyShardedDataParallel, parallel/fsdp): each rank holds a
//     1/DP shard of every unit's gradients (ZeRO-2) and parameters
//     (ZeRO-3), reduced and gathered per unit through the model's unit
//     hooks.
// Both lay their buffers out as FlatLayout (flat_layout.h) and hand the
// optimizer the FlatPieces this rank updates. training::WrapDataParallel
// picks one from --data-parallel-sharding-strategy; the trainer and the
// checkpoint code use only this interface.
//
// The step, in this order (training/trainer.cc drives it):
//   BeginStep           the last step's updated parameters will be in place
//                       when used (FinishParamGather now, unless hooks wait
//                       per unit), and ZeroGrads: every gradient of the step
//                       starts at zero;
//   the micro-batches   with set_is_last_microbatch(last) before each, so
//                       the replicated implementation reduces only on the
//                       last one (Megatron's no_sync);
//   FinishGradSync      gradients averaged over DP (in this rank's shards
//                       where sharded);
//   SyncSharedGradients (sharded) tied copies' gradients summed over the
//                       embedding group;
//   FinalizeGradients   sequence-parallel gradients summed over TP;
//   the optimizer's Step (an optimizer from CreateOptimizer), which starts
//                       the next gather of updated parameters itself.
// Checkpoints: GatherFullParams makes every parameter's value whole until
// ReleaseFullParams; ScatterFullParams copies values a load wrote into the
// implementation's own copies (fp32 main shards).
//
// Ownership: an implementation does not own the models or parameters it
// wraps; they must outlive it. Hooks it installed on models are removed by
// its destructor, which also waits for its collectives in flight.
//
// Collectives: BeginStep, FinishParamGather, FinishGradSync, FinalizeGradients,
// GatherFullParams and ScatterFullParams are collective over the
// data-parallel group (FinalizeGradients over the tensor-parallel group):
// every rank calls them in the same order. ZeroGrads,
// set_is_last_microbatch, ReleaseFullParams and the accessors make no
// collective call.
//
// Thread-safety: none; one thread drives the object and its models.
//
// Errors: a failed collective is returned naming the bucket or unit; the
// gradients (and, for a failed gather, parameters) are then unspecified and
// the object may only be destroyed.

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mcc {
namespace data_parallel {

class DataParallel {
 public:
  virtual ~DataParallel() = default;

  virtual absl::Status BeginStep() = 0;
  // Waits until every parameter updated by the last step is in place.
  virtual absl::Status FinishParamGather() = 0;
  virtual void ZeroGrads() = 0;
  virtual void set_is_last_microbatch(bool last) = 0;
  virtual absl::Status FinishGradSync() = 0;
  // Where gradients live in shards (shards_gradients()): after
  // FinishGradSync, sums the gradients of parameters shared with another
  // pipeline stage (a tied word embedding) over `embedding_group`, since the
  // models' SyncSharedGradients no longer sees them. The replicated
  // implementation leaves that to the models (before FinishGradSync) and
  // does nothing here. Collective over the DP group and embedding_group
  // where sharded.
  virtual absl::Status SyncSharedGradients(
      comm::ProcessGroup* /*embedding_group*/) {
    return absl::OkStatus();
  }
  virtual absl::Status FinalizeGradients() = 0;

  // The optimizer over the pieces this rank updates (whole parameters when
  // replicated without the distributed optimizer, else this rank's shards;
  // the gradient norm is then summed over DP too). Create it once, after
  // the wrapper; it must not outlive the wrapper.
  virtual absl::StatusOr<std::unique_ptr<optim::Optimizer>> CreateOptimizer(
      const optim::OptimizerConfig& config,
      const optim::OptimizerGroups& groups) = 0;

  // The fp32 gradient of `param` (one of parameters()) this rank holds
  // once FinishGradSync and FinalizeGradients ran, for the gradient
  // consistency check: the replicated implementation's main_grad, whole
  // (under the distributed optimizer only this rank's shard of it is
  // reduced over DP); the sharded one's pieces of it in this rank's shards,
  // one after another (possibly none). It views the gradient, valid until
  // the next step begins. Not collective.
  virtual absl::StatusOr<Tensor> HeldGradient(const Parameter& param) const {
    return param.main_grad;
  }
  // Whether HeldGradient is the same on every DP rank (replicated, without
  // the distributed optimizer's reduce-scatter).
  virtual bool holds_whole_reduced_gradients() const = 0;

  virtual absl::Status GatherFullParams() = 0;
  virtual absl::Status ScatterFullParams() = 0;
  virtual absl::Status ReleaseFullParams() = 0;

  // Whether gradients live only in this rank's shards between
  // FinishGradSync and the optimizer step (the sharded implementation):
  // then parameters' main_grad is not meaningful outside a unit's compute.
  virtual bool shards_gradients() const = 0;
  // Every parameter wrapped, in the models' order.
  virtual const ParameterList& parameters() const = 0;
  virtual comm::ProcessGroup* dp_group() const = 0;
  // For the run log: the strategy and what it does with buckets, overlap
  // and gathers ("optim (distributed optimizer); gradient buckets of ...").
  virtual std::string Describe() const = 0;

  int dp_size() const { return dp_group() == nullptr ? 1 : dp_group()->size(); }
  int dp_rank() const { return dp_group() == nullptr ? 0 : dp_group()->rank(); }
};

}  // namespace data_parallel
}  // namespace mcc

#endif  // PARALLEL_DATA_PARALLEL_DATA_PARALLEL_H_
