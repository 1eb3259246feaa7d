#ifndef PARALLEL_MAPPINGS_H_
#define PARALLEL_MAPPINGS_H_

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/tensor.h"

namespace mcc {
namespace parallel {

// Megatron's tensor- and sequence-parallel mappings: communication steps as
// layers, each a forward and its backward. `group` is the tensor-parallel
// group; null or of size 1 means no communication (the serial model). The
// sequence dimension is the first one (activations are [s, b, h], flattened
// to [s * b, h]), so splitting along it is a zero-copy slice. Every result is
// a fresh or contiguous tensor: collectives never see strided buffers.

// Collectives that the mappings are built from.
absl::StatusOr<Tensor> AllReduceSum(comm::ProcessGroup* group, const Tensor& x);
// [n, ...] on each rank -> [size * n, ...], rank order.
absl::StatusOr<Tensor> GatherFirstDim(comm::ProcessGroup* group,
                                      const Tensor& x);
// [size * n, ...] -> this rank's block [n, ...] of the sum over ranks.
absl::StatusOr<Tensor> ReduceScatterFirstDim(comm::ProcessGroup* group,
                                             const Tensor& x);
// [size * n, ...] -> this rank's block (a view).
absl::StatusOr<Tensor> SplitFirstDim(comm::ProcessGroup* group,
                                     const Tensor& x);
// Each rank's piece along dimension `dim` -> the whole tensor, pieces in
// rank order (a tensor-parallel parameter's full value, for example).
absl::StatusOr<Tensor> GatherAlongDim(comm::ProcessGroup* group,
                                      const Tensor& x, int dim);
// [..., n] on each rank -> [..., size * n].
absl::StatusOr<Tensor> GatherLastDim(comm::ProcessGroup* group,
                                     const Tensor& x);
// [..., size * n] -> this rank's [..., n] (a copy).
absl::StatusOr<Tensor> SplitLastDim(comm::ProcessGroup* group, const Tensor& x);

// Forward identity; backward all-reduce.
struct CopyToTensorParallelRegion {
  static absl::StatusOr<Tensor> Forward(comm::ProcessGroup* g, const Tensor& x);
  static absl::StatusOr<Tensor> Backward(comm::ProcessGroup* g,
                                         const Tensor& dy);
};

// Forward all-reduce; backward identity.
struct ReduceFromTensorParallelRegion {
  static absl::StatusOr<Tensor> Forward(comm::ProcessGroup* g, const Tensor& x);
  static absl::StatusOr<Tensor> Backward(comm::ProcessGroup* g,
                                         const Tensor& dy);
};

// Forward split of the last dimension; backward all-gather of it.
struct ScatterToTensorParallelRegion {
  static absl::StatusOr<Tensor> Forward(comm::ProcessGroup* g, const Tensor& x);
  static absl::StatusOr<Tensor> Backward(comm::ProcessGroup* g,
                                         const Tensor& dy);
};

// Forward all-gather of the last dimension; backward split of it.
struct GatherFromTensorParallelRegion {
  static absl::StatusOr<Tensor> Forward(comm::ProcessGroup* g, const Tensor& x);
  static absl::StatusOr<Tensor> Backward(comm::ProcessGroup* g,
                                         const Tensor& dy);
};

// Forward split of the sequence; backward all-gather of it.
struct ScatterToSequenceParallelRegion {
  static absl::StatusOr<Tensor> Forward(comm::ProcessGroup* g, const Tensor& x);
  static absl::StatusOr<Tensor> Backward(comm::ProcessGroup* g,
                                         const Tensor& dy);
};

// Forward all-gather of the sequence; backward reduce-scatter.
struct GatherFromSequenceParallelRegion {
  static absl::StatusOr<Tensor> Forward(comm::ProcessGroup* g, const Tensor& x);
  static absl::StatusOr<Tensor> Backward(comm::ProcessGroup* g,
                                         const Tensor& dy);
};

// Forward reduce-scatter of the sequence; backward all-gather.
struct ReduceScatterToSequenceParallelRegion {
  static absl::StatusOr<Tensor> Forward(comm::ProcessGroup* g, const Tensor& x);
  static absl::StatusOr<Tensor> Backward(comm::ProcessGroup* g,
                                         const Tensor& dy);
};

inline int GroupSize(const comm::ProcessGroup* g) {
  return g == nullptr ? 1 : g->size();
}
inline int GroupRank(const comm::ProcessGroup* g) {
  return g == nullptr ? 0 : g->rank();
}

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_MAPPINGS_H_
