// Launcher for the strided-copy CUDA kernel of //core/ops/cuda:kernels (the
// StridedCopy slot, core/ops/layout.h). Conventions as in elementwise.h.
#ifndef CORE_OPS_CUDA_LAYOUT_H_
#define CORE_OPS_CUDA_LAYOUT_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace mcc {
namespace cuda_kernels {

// ops::StridedCopyPlan's fields (a plain copy, so this header needs no
// core headers): for every index i of `shape`,
//   dst[dst_offset + sum_k i_k dst_strides[k]] =
//       src[src_offset + sum_k i_k src_strides[k]],
// offsets and strides in elements. rank 0 copies one element.
struct CopyPlan {
  static constexpr int kMaxDims = 8;
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t src_strides[kMaxDims] = {};
  int64_t dst_strides[kMaxDims] = {};
  int64_t src_offset = 0;
  int64_t dst_offset = 0;
};

// Copies elements of elem_bytes (2, 4 or 8) through the plan; the bits are
// moved, never converted. src and dst do not overlap (the op checks).
cudaError_t StridedCopy(const void* src, void* dst, int elem_bytes,
                        const CopyPlan& plan, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_LAYOUT_H_
