#include "parallel/data_parallel/replica_groups.h"

#include <utility>

namespace mcc {
namespace data_parallel {
namespace {

bool Replicates(const comm::ProcessGroup* group) {
  return group != nullptr && group->size() > 1;
}

}  // namespace

std::vector<ReplicaGroup> ReplicaGroupsOf(const ParameterList& params,
                                          const ReplicaGroupSources& sources) {
  ParameterList dense, experts, not_split, shared;
  for (const auto& p : params) {
    (p->expert_parallel ? experts : dense).push_back(p);
    if (!p->is_tensor_parallel() && !p->expert_parallel) not_split.push_back(p);
    if (p->shared_with_other_stage) shared.push_back(p);
  }
  std::vector<ReplicaGroup> groups;
  auto add = [&](const char* kind, comm::ProcessGroup* group,
                 const ParameterList& list) {
    if (Replicates(group) && !list.empty()) {
      groups.push_back(ReplicaGroup{kind, group, list});
    }
  };
  add("data-parallel", sources.data, dense);
  add("expert-data-parallel", sources.expert_data, experts);
  add("tensor-parallel", sources.tensor, not_split);
  add("context-parallel", sources.context, params);
  add("embedding", sources.embedding, shared);
  return groups;
}

}  // namespace data_parallel
}  // namespace mcc
