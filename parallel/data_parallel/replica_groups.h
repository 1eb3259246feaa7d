#ifndef PARALLEL_DATA_PARALLEL_REPLICA_GROUPS_H_
#define PARALLEL_DATA_PARALLEL_REPLICA_GROUPS_H_

// Which parameters must be identical on which ranks. A replica group is a
// list of parameters and the process group over which each of them (its
// value, and its gradient once reduced) is the same on every rank. The
// cross-rank consistency checks (weight_hash.h, grad_consistency.h) run over
// these groups, so a new kind of replication (a new parallel dimension) is
// one more entry in ReplicaGroupsOf.
//
// Plain values: no collective calls. Groups and parameters are not owned
// and must outlive the values that name them.

#include <string>
#include <vector>

#include "core/comm/process_group.h"
#include "core/parameter.h"

namespace mcc {
namespace data_parallel {

struct ReplicaGroup {
  // What replicates the parameters, for messages: "data-parallel",
  // "tensor-parallel", "context-parallel", "embedding".
  std::string kind;
  // Null or one rank: trivially consistent.
  comm::ProcessGroup* group = nullptr;
  // In the same order (and with the same shapes) on every rank of group.
  ParameterList params;
};

// The process groups a rank's parameters are replicated over (each may be
// null; embedding: null on ranks that hold no copy of a tied weight).
struct ReplicaGroupSources {
  comm::ProcessGroup* data = nullptr;
  comm::ProcessGroup* tensor = nullptr;
  comm::ProcessGroup* context = nullptr;
  comm::ProcessGroup* embedding = nullptr;
  // Mixture of experts: the expert-data-parallel group, where expert
  // weights (Parameter::expert_parallel) are replicated instead of `data`.
  comm::ProcessGroup* expert_data = nullptr;
};

// This rank's replica groups of `params`, in a fixed order every rank
// agrees on:
//   data-parallel    every parameter but the expert weights, over `data`;
//   expert-data-parallel  the expert weights, over `expert_data`;
//   tensor-parallel  parameters not split over TP (norm weights and biases,
//                    row-parallel biases, learned position embeddings);
//   context-parallel every parameter, over `context`;
//   embedding        parameters shared with another pipeline stage (the
//                    tied word embedding of the first and last stages).
// Groups with one rank or no parameters are left out.
std::vector<ReplicaGroup> ReplicaGroupsOf(const ParameterList& params,
                                          const ReplicaGroupSources& sources);

}  // namespace data_parallel
}  // namespace mcc

#endif  // PARALLEL_DATA_PARALLEL_REPLICA_GROUPS_H_
