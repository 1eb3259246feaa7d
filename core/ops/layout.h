#ifndef CORE_OPS_LAYOUT_H_
#define CORE_OPS_LAYOUT_H_

// Ops that move elements between layouts without touching their values:
// a general strided copy, and on top of it permutes of dimensions and
// concatenation/splitting along a dimension. The model's layout changes
// ([b, s, ...] <-> [s, b, ...], the QKV split, KV-cache writes) and the
// parallel layers' copies of pieces of flat buffers use these instead of
// host pointers.
//
// Every op validates its arguments (tensors defined, one device, one dtype,
// every element addressed inside its tensor, no write twice, source and
// destination apart) and runs the one StridedCopy slot's kernel once per
// output (core/ops/dispatch.h: the device's current stream, no host
// synchronisation). The destination's addressed elements are overwritten;
// its other elements are left as they were.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// The most dimensions a strided copy has.
inline constexpr int kMaxCopyDims = 8;

// A copy of `rank` nested loops: for every index (i_0, ..., i_{rank-1}) with
// 0 <= i_k < shape[k],
//   dst[dst_offset + sum_k i_k * dst_strides[k]] =
//       src[src_offset + sum_k i_k * src_strides[k]]
// with offsets and strides in elements of the (flat) tensors. Strides are
// >= 0. A plain struct, so device kernels take it by value.
struct StridedCopyPlan {
  int rank = 0;
  int64_t shape[kMaxCopyDims] = {};
  int64_t src_strides[kMaxCopyDims] = {};
  int64_t dst_strides[kMaxCopyDims] = {};
  int64_t src_offset = 0;
  int64_t dst_offset = 0;
};

// The strides of a contiguous row-major tensor of this shape.
void ContiguousStrides(absl::Span<const int64_t> shape, int64_t* strides);

// The plan that copies the other way (source and destination swapped): the
// backward of a layout change, e.g. merging dq, dk, dv back into dqkv.
StridedCopyPlan SwapSides(const StridedCopyPlan& plan);

// dst = src through the plan. src and dst have one dtype and one device and
// do not overlap. For example, the QKV projection's output qkv
// [s, b, groups, hpg + 2, d] split into q [b, s, groups, hpg, d]
// (hpg = heads per group) takes shape {b, s, groups, hpg, d}, src strides
// {G, b * G, (hpg + 2) * d, d, 1} with G = groups * (hpg + 2) * d, src
// offset 0 (k: hpg * d and shape {b, s, groups, 1, d}; v: (hpg + 1) * d),
// and q's contiguous strides; SwapSides of the three plans merges dq, dk,
// dv back into dqkv. A KV-cache write of k [b, n, row] into cache
// [b, capacity, row] at `position` is shape {b, n * row}, src strides
// {n * row, 1}, dst strides {capacity * row, 1}, dst offset position * row.
absl::Status CopyStrided(const Tensor& src, const StridedCopyPlan& plan,
                         Tensor* dst);

// y = x with dimensions permuted: y.shape[i] == x.shape[perm[i]], and
// y[j_0, ...] = x[i] where i_{perm[k]} = j_k. perm is a permutation of
// 0..rank-1 (rank <= kMaxCopyDims). Example: [b, s, h] -> [s, b, h] is
// perm {1, 0, 2}.
absl::Status Permute(const Tensor& x, absl::Span<const int> perm, Tensor* y);

// y = the inputs laid side by side along dimension dim: every input has y's
// shape except in dim, where the sizes add up to y's.
absl::Status Concat(absl::Span<const Tensor> xs, int dim, Tensor* y);

// The inverse: outs[i] = the i-th consecutive piece of x along dim.
absl::Status Split(const Tensor& x, int dim, absl::Span<Tensor* const> outs);

using StridedCopyKernel = absl::Status (*)(const Tensor& src,
                                           const StridedCopyPlan& plan,
                                           Tensor* dst);
KernelSlot<StridedCopyKernel>& StridedCopyKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_LAYOUT_H_
