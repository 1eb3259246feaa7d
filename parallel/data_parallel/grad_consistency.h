#ifndef PARALLEL_DATA_PARALLEL_GRAD_CONSISTENCY_H_
#define PARALLEL_DATA_PARALLEL_GRAD_CONSISTENCY_H_

// --check-grad-consistency-interval: after a step's gradients are reduced
// (the DP all-reduce, the sequence-parallel sum of norm gradients over TP,
// the tied embedding's sum over the embedding group), every replica of a
// parameter must hold the same gradient. This compares them over each
// replica group (replica_groups.h), so a reduction that was skipped or
// went to the wrong ranks shows up as the tensor, the ranks and how far
// apart they are, before the optimizer spreads it into the weights.

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/replica_groups.h"

namespace mcc {
namespace data_parallel {

// The fp32 gradient this rank holds for a parameter after the reduction
// (DataParallel::HeldGradient, or main_grad without data parallelism).
using HeldGradientFn = std::function<absl::StatusOr<Tensor>(const Parameter&)>;

// Compares, over replicas.group, the gradient each rank holds for each of
// replicas.params: the hashes of their bytes are all-gathered, and at the
// first parameter where they differ the gradients themselves are
// all-gathered. When two ranks' gradients differ by more than `tolerance`
// (absolute, elementwise; 0: bitwise), returns an Internal error, the same
// on every rank of the group, naming the parameter, the pair of ranks
// (group and global) that differ most, and their largest elementwise
// difference; within the tolerance the next parameters are compared.
// Gradients on another device are read to the host (a check, not the
// step). Collective over replicas.group.
absl::Status CheckGradConsistency(const ReplicaGroup& replicas,
                                  const HeldGradientFn& held,
                                  double tolerance = 0.0);

// The gradients a rank holds under `dp` (DataParallel::HeldGradient), or
// the parameters' main_grad where dp is null. dp must outlive the result.
HeldGradientFn HeldGradientsOf(const DataParallel* dp);

// The replica groups whose held gradients are comparable under `dp`
// (ReplicaGroupsOf otherwise): the data-parallel group only where every DP
// rank holds the whole reduced gradient (not under the distributed
// optimizer or FSDP, whose ranks hold different shards), the embedding
// group not where gradients are sharded (the two stages' shards do not line
// up). TP and CP ranks of one DP rank hold the same shards, so those stay.
std::vector<ReplicaGroup> GradientReplicaGroups(
    const ParameterList& params, const ReplicaGroupSources& sources,
    const DataParallel* dp);

// Each group in order; the first disagreement is returned (see
// CheckWeightHashAcrossReplicaGroups for which ranks see it).
absl::Status CheckGradConsistencyAcrossReplicaGroups(
    const std::vector<ReplicaGroup>& groups, const HeldGradientFn& held,
    double tolerance = 0.0);

}  // namespace data_parallel
}  // namespace mcc

#endif  // PARALLEL_DATA_PARALLEL_GRAD_CONSISTENCY_H_
