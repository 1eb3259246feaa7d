#include "parallel/mappings.h"

#include "absl/strings/str_cat.h"
#include "core/ops/layout.h"
#include "core/status_macros.h"

namespace mcc {
namespace parallel {

absl::StatusOr<Tensor> AllReduceSum(comm::ProcessGroup* group,
                                    const Tensor& x) {
  Tensor out = x.Clone();
  if (GroupSize(group) == 1) return out;
  MCC_RETURN_IF_ERROR(group->AllReduceSync(&out, comm::ReduceOp::kSum));
  return out;
}

absl::StatusOr<Tensor> GatherFirstDim(comm::ProcessGroup* group,
                                      const Tensor& x) {
  if (GroupSize(group) == 1) return x;
  Shape shape = x.shape();
  shape[0] *= group->size();
  Tensor out = Tensor::Empty(shape, x.dtype(), x.device());
  MCC_RETURN_IF_ERROR(group->AllGatherSync(x, &out));
  return out;
}

absl::StatusOr<Tensor> ReduceScatterFirstDim(comm::ProcessGroup* group,
                                             const Tensor& x) {
  if (GroupSize(group) == 1) return x;
  if (x.dim() == 0 || x.size(0) % group->size() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce-scatter along the sequence: first dimension of ", x.Describe(),
        " is not divisible by the tensor-parallel size ", group->size()));
  }
  Shape shape = x.shape();
  shape[0] /= group->size();
  Tensor out = Tensor::Empty(shape, x.dtype(), x.device());
  MCC_RETURN_IF_ERROR(
      group->ReduceScatter(x, &out, comm::ReduceOp::kSum)->Wait());
  return out;
}

absl::StatusOr<Tensor> SplitFirstDim(comm::ProcessGroup* group,
                                     const Tensor& x) {
  const int n = GroupSize(group);
  if (n == 1) return x;
  if (x.dim() == 0 || x.size(0) % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "split along the sequence: first dimension of ", x.Describe(),
        " is not divisible by the tensor-parallel size ", n));
  }
  const int64_t rows = x.size(0) / n;
  return x.Slice(rows * group->rank(), rows * (group->rank() + 1));
}

absl::StatusOr<Tensor> GatherAlongDim(comm::ProcessGroup* group,
                                      const Tensor& x, int dim) {
  const int n = GroupSize(group);
  if (n == 1) return x;
  if (dim < 0 || dim >= x.dim()) {
    return absl::InvalidArgumentError(
        absl::StrCat("gather along dimension ", dim, " of ", x.Describe()));
  }
  // Gather rank blocks along dim 0, then interleave them along `dim`:
  // [n, outer, inner] -> [outer, n, inner].
  Tensor stacked = Tensor::Empty({n * x.numel()}, x.dtype(), x.device());
  MCC_ASSIGN_OR_RETURN(Tensor flat, x.Reshape({-1}));
  MCC_RETURN_IF_ERROR(group->AllGatherSync(flat, &stacked));
  int64_t outer = 1;
  for (int d = 0; d < dim; ++d) outer *= x.size(d);
  const int64_t inner = outer == 0 ? 0 : x.numel() / outer;
  Shape shape = x.shape();
  shape[dim] *= n;
  if (outer == 1) return stacked.Reshape(shape);
  Tensor out = Tensor::Empty(shape, x.dtype(), x.device());
  MCC_ASSIGN_OR_RETURN(Tensor blocks, stacked.Reshape({n, outer, inner}));
  MCC_ASSIGN_OR_RETURN(Tensor interleaved, out.Reshape({outer, n, inner}));
  MCC_RETURN_IF_ERROR(ops::Permute(blocks, {1, 0, 2}, &interleaved));
  return out;
}

absl::StatusOr<Tensor> GatherLastDim(comm::ProcessGroup* group,
                                     const Tensor& x) {
  return GatherAlongDim(group, x, x.dim() - 1);
}

absl::StatusOr<Tensor> SplitLastDim(comm::ProcessGroup* group,
                                    const Tensor& x) {
  const int n = GroupSize(group);
  if (n == 1) return x;
  const int64_t total = x.size(-1);
  if (total % n != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("split along the last dimension: ", x.Describe(),
                     " is not divisible by the tensor-parallel size ", n));
  }
  const int64_t cols = total / n;
  Shape shape = x.shape();
  shape.back() = cols;
  Tensor out = Tensor::Empty(shape, x.dtype(), x.device());
  // This rank's column block of every row.
  ops::StridedCopyPlan plan;
  plan.rank = 2;
  plan.shape[0] = x.numel() / total;
  plan.shape[1] = cols;
  plan.src_strides[0] = total;
  plan.src_strides[1] = 1;
  plan.dst_strides[0] = cols;
  plan.dst_strides[1] = 1;
  plan.src_offset = cols * group->rank();
  MCC_RETURN_IF_ERROR(ops::CopyStrided(x, plan, &out));
  return out;
}

absl::StatusOr<Tensor> CopyToTensorParallelRegion::Forward(comm::ProcessGroup*,
                                                           const Tensor& x) {
  return x;
}
absl::StatusOr<Tensor> CopyToTensorParallelRegion::Backward(
    comm::ProcessGroup* g, const Tensor& dy) {
  return AllReduceSum(g, dy);
}

absl::StatusOr<Tensor> ReduceFromTensorParallelRegion::Forward(
    comm::ProcessGroup* g, const Tensor& x) {
  return AllReduceSum(g, x);
}
absl::StatusOr<Tensor> ReduceFromTensorParallelRegion::Backward(
    comm::ProcessGroup*, const Tensor& dy) {
  return dy;
}

absl::StatusOr<Tensor> ScatterToTensorParallelRegion::Forward(
    comm::ProcessGroup* g, const Tensor& x) {
  return SplitLastDim(g, x);
}
absl::StatusOr<Tensor> ScatterToTensorParallelRegion::Backward(
    comm::ProcessGroup* g, const Tensor& dy) {
  return GatherLastDim(g, dy);
}

absl::StatusOr<Tensor> GatherFromTensorParallelRegion::Forward(
    comm::ProcessGroup* g, const Tensor& x) {
  return GatherLastDim(g, x);
}
absl::StatusOr<Tensor> GatherFromTensorParallelRegion::Backward(
    comm::ProcessGroup* g, const Tensor& dy) {
  return SplitLastDim(g, dy);
}

absl::StatusOr<Tensor> ScatterToSequenceParallelRegion::Forward(
    comm::ProcessGroup* g, const Tensor& x) {
  return SplitFirstDim(g, x);
}
absl::StatusOr<Tensor> ScatterToSequenceParallelRegion::Backward(
    comm::ProcessGroup* g, const Tensor& dy) {
  return GatherFirstDim(g, dy);
}

absl::StatusOr<Tensor> GatherFromSequenceParallelRegion::Forward(
    comm::ProcessGroup* g, const Tensor& x) {
  return GatherFirstDim(g, x);
}
absl::StatusOr<Tensor> GatherFromSequenceParallelRegion::Backward(
    comm::ProcessGroup* g, const Tensor& dy) {
  return ReduceScatterFirstDim(g, dy);
}

absl::StatusOr<Tensor> ReduceScatterToSequenceParallelRegion::Forward(
    comm::ProcessGroup* g, const Tensor& x) {
  return ReduceScatterFirstDim(g, x);
}
absl::StatusOr<Tensor> ReduceScatterToSequenceParallelRegion::Backward(
    comm::ProcessGroup* g, const Tensor& dy) {
  return GatherFirstDim(g, dy);
}

}  // namespace parallel
}  // namespace mcc
