#ifndef PARALLEL_DATA_PARALLEL_WEIGHT_HASH_H_
#define PARALLEL_DATA_PARALLEL_WEIGHT_HASH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "core/comm/process_group.h"
#include "core/parameter.h"
#include "core/tensor.h"

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

}  // namespace data_parallel
}  // namespace mcc

#endif  // PARALLEL_DATA_PARALLEL_WEIGHT_HASH_H_
