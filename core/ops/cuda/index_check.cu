#include "core/ops/cuda/index_check.h"
#include "core/ops/cuda/kernel_util.cuh"

namespace mcc {
namespace cuda_kernels {
namespace {

using internal::GlobalThread;
using internal::GridFor;
using internal::GridStride;
using internal::kThreads;

// Ids are almost always in range, so the atomic (the minimum over every bad
// index, whatever the order threads find them in) is rare.
template <typename T>
__global__ void FirstOutOfRangeKernel(const T* ids, int64_t n, int64_t limit,
                                      int64_t ignore_index,
                                      unsigned long long* first) {
  for (int64_t i = GlobalThread(); i < n; i += GridStride()) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id != ignore_index && (id < 0 || id >= limit)) {
      atomicMin(first, static_cast<unsigned long long>(i));
    }
  }
}

}  // namespace

cudaError_t FirstOutOfRange(const void* ids, ElemType it, int64_t n,
                            int64_t limit, int64_t ignore_index,
                            unsigned long long* first, cudaStream_t stream) {
  cudaError_t e = cudaMemsetAsync(first, 0xff, sizeof(*first), stream);
  if (e != cudaSuccess || n == 0) return e;
  if (it == ElemType::kI32) {
    FirstOutOfRangeKernel<<<GridFor(n), kThreads, 0, stream>>>(
        static_cast<const int32_t*>(ids), n, limit, ignore_index, first);
  } else {
    FirstOutOfRangeKernel<<<GridFor(n), kThreads, 0, stream>>>(
        static_cast<const int64_t*>(ids), n, limit, ignore_index, first);
  }
  return cudaGetLastError();
}

}  // namespace cuda_kernels
}  // namespace mcc
