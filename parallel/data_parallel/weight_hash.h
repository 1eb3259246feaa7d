#ifndef PARALLEL_DATA_PARALLEL_WEIGHT_HASH_H_
#define PARALLEL_DATA_PARALLEL_WEIGHT_HASH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/comm/process_group.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "parallel/data_parallel/replica_groups.h"

namespace mcc {
namespace data_parallel {

// FNV-1a (64-bit) of a CPU tensor's bytes.
uint64_t HashTensorBytes(const Tensor& t);

// Megatron's --check-weight-hash-across-dp-replicas-interval: every
// data-parallel replica hashes each of its parameters and the hashes are
// all-gathered over `dp`. When they differ, returns an Internal error (on
// every rank) that names the first parameter (in list order) that differs
// and, for each distinct hash, the data-parallel ranks (and global ranks)
// that hold it. A null or size-1 group always agrees. Parameters on another
// device are read through one explicit copy to the host each.
absl::Status CheckWeightHashAcrossReplicas(const ParameterList& params,
                                           comm::ProcessGroup* dp);

// The same check over any replica group (replica_groups.h): the error says
// "across <kind> replicas" and names the <kind> ranks of each hash.
// Collective over replicas.group.
absl::Status CheckWeightHash(const ReplicaGroup& replicas);

// Each group in order (every rank of every group must call this with the
// groups ReplicaGroupsOf gives it); the first disagreement is returned.
// Ranks of a group that agrees go on to the next group, so a rank in a
// failing group and one outside it may return different statuses: the job
// stops on the error either way. Parameters' values must be whole (under
// ZeRO-3, between GatherFullParams and ReleaseFullParams).
absl::Status CheckWeightHashAcrossReplicaGroups(
    const std::vector<ReplicaGroup>& groups);

}  // namespace data_parallel
}  // namespace mcc

#endif  // PARALLEL_DATA_PARALLEL_WEIGHT_HASH_H_
