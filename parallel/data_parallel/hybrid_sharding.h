#ifndef PARALLEL_DATA_PARALLEL_HYBRID_SHARDING_H_
#define PARALLEL_DATA_PARALLEL_HYBRID_SHARDING_H_

// HSDP, Megatron's --num-distributed-optimizer-instances N: the
// data-parallel ranks form N instances (parallel::RankLayout::
// InstanceGroups: contiguous ranks). Optimizer state (and, under ZeRO-3,
// parameters) is sharded within an instance and replicated across them.
// Gradients are reduce-scattered within the instance, then all-reduced
// over the cross-instance group (the ranks holding the same shard); the
// updated parameters are all-gathered within the instance only. Both
// replicated (distributed optimizer) and sharded (ZeRO-2/3) data
// parallelism take it; without sharded state there is nothing to
// replicate, and it is refused.
//
// Plain values: no collective calls. The groups are not owned.

#include <string>

#include "absl/status/status.h"
#include "core/comm/process_group.h"

namespace mcc {
namespace data_parallel {

struct HybridSharding {
  // This rank's instance; null: no HSDP (state sharded over all of DP).
  comm::ProcessGroup* instance = nullptr;
  // The ranks of the other instances holding this rank's shard.
  comm::ProcessGroup* cross_instance = nullptr;
  // Mixture of experts: the expert-data-parallel group split alike
  // (parallel::RankLayout::ExpertInstanceGroups), where expert weights'
  // state is sharded, and across. Needed when HSDP meets expert weights
  // over more than one expert-data-parallel rank.
  comm::ProcessGroup* expert_instance = nullptr;
  comm::ProcessGroup* expert_cross_instance = nullptr;

  bool enabled() const { return instance != nullptr; }
  int instances() const {
    return cross_instance == nullptr ? 1 : cross_instance->size();
  }
  // The group state is sharded over: the instance, or all of `dp`.
  comm::ProcessGroup* ShardGroup(comm::ProcessGroup* dp) const {
    return enabled() ? instance : dp;
  }
  // The group expert weights' state is sharded over: the expert instance,
  // or all of `expert_data`; and where a reduced expert shard is summed
  // (null without HSDP).
  comm::ProcessGroup* ExpertShardGroup(comm::ProcessGroup* expert_data) const {
    return enabled() ? expert_instance : expert_data;
  }
  comm::ProcessGroup* ExpertCrossGroup() const {
    return enabled() ? expert_cross_instance : nullptr;
  }
};

// Refuses HSDP where state is not sharded (`shards_state` false), and
// groups whose sizes do not multiply to dp's, naming the flag.
absl::Status CheckHybridSharding(const HybridSharding& hybrid,
                                 comm::ProcessGroup* dp, bool shards_state);
// With expert weights over `expert_data` (may be null: one rank): under
// HSDP the expert instance groups must be given and multiply to its size.
absl::Status CheckExpertHybridSharding(const HybridSharding& hybrid,
                                       comm::ProcessGroup* expert_data);

}  // namespace data_parallel
}  // namespace mcc

#endif  // PARALLEL_DATA_PARALLEL_HYBRID_SHARDING_H_
