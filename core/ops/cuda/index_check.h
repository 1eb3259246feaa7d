// Launcher for the CUDA kernel of the CheckIndexRange slot
// (core/ops/index_check.h). Conventions as in elementwise.h.
#ifndef CORE_OPS_CUDA_INDEX_CHECK_H_
#define CORE_OPS_CUDA_INDEX_CHECK_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// *first (device memory) = the smallest flat index i < n with ids[i]
// outside [0, limit) and != ignore_index, or ~0ull when there is none. ids
// are int32 or int64 (it). Sets *first itself; no host synchronisation.
cudaError_t FirstOutOfRange(const void* ids, ElemType it, int64_t n,
                            int64_t limit, int64_t ignore_index,
                            unsigned long long* first, cudaStream_t stream);

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_INDEX_CHECK_H_
