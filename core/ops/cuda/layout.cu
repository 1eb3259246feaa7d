#include "core/ops/cuda/kernel_util.cuh"
#include "core/ops/cuda/layout.h"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;
using internal::kThreads;

// One thread per element, the innermost dimension fastest (consecutive
// threads touch consecutive elements where the strides are 1).
template <typename T>
__global__ void StridedCopyKernel(const T* src, T* dst, CopyPlan p,
                                  int64_t total) {
  for (int64_t i = GlobalThread(); i < total; i += GridStride()) {
    int64_t rest = i, so = p.src_offset, dof = p.dst_offset;
    for (int k = p.rank - 1; k >= 0; --k) {
      const int64_t idx = rest % p.shape[k];
      rest /= p.shape[k];
      so += idx * p.src_strides[k];
      dof += idx * p.dst_strides[k];
    }
    dst[dof] = src[so];
  }
}

template <typename T>
cudaError_t Launch(const void* src, void* dst, const CopyPlan& plan,
                   int64_t total, cudaStream_t stream) {
  StridedCopyKernel<<<GridFor(total), kThreads, 0, stream>>>(
      static_cast<const T*>(src), static_cast<T*>(dst), plan, total);
  return cudaGetLastError();
}

}  // namespace

cudaError_t StridedCopy(const void* src, void* dst, int elem_bytes,
                        const CopyPlan& plan, cudaStream_t stream) {
  int64_t total = 1;
  for (int k = 0; k < plan.rank; ++k) total *= plan.shape[k];
  if (total == 0) return cudaSuccess;
  switch (elem_bytes) {
    case 2:
      return Launch<uint16_t>(src, dst, plan, total, stream);
    case 4:
      return Launch<uint32_t>(src, dst, plan, total, stream);
    case 8:
      return Launch<uint64_t>(src, dst, plan, total, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace cuda_kernels
}  // namespace mcc
