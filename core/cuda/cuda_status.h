#ifndef CORE_CUDA_CUDA_STATUS_H_
#define CORE_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "glog/logging.h"

namespace mcc {
namespace cuda {

// An absl::Status for a CUDA runtime error: OK for cudaSuccess, otherwise an
// error naming the call, the CUDA error name and string, and file:line, e.g.
// "cudaMalloc(&p, 64) failed at core/cuda/x.cc:12: cudaErrorMemoryAllocation
// (out of memory)". Out-of-memory maps to ResourceExhausted, a missing
// driver or device to FailedPrecondition, bad arguments to InvalidArgument,
// everything else to Internal.
absl::Status CudaErrorToStatus(cudaError_t error, const char* call,
                               const char* file, int line);

}  // namespace cuda
}  // namespace mcc

// Evaluates a CUDA runtime call; returns an absl::Status from the enclosing
// function when it fails. Clears CUDA's sticky last-error for that call.
#define MCC_CUDA_RETURN_IF_ERROR(expr)                                        \
  do {                                                                        \
    const cudaError_t _mcc_cuda_error = (expr);                               \
    if (_mcc_cuda_error != cudaSuccess) {                                     \
      (void)cudaGetLastError();                                               \
      return ::mcc::cuda::CudaErrorToStatus(_mcc_cuda_error, #expr, __FILE__, \
                                            __LINE__);                        \
    }                                                                         \
  } while (0)

// As above, for invariants: dies with the same message.
#define MCC_CUDA_CHECK(expr)                                               \
  do {                                                                     \
    const cudaError_t _mcc_cuda_error = (expr);                            \
    if (_mcc_cuda_error != cudaSuccess) {                                  \
      LOG(FATAL) << ::mcc::cuda::CudaErrorToStatus(_mcc_cuda_error, #expr, \
                                                   __FILE__, __LINE__)     \
                        .message();                                        \
    }                                                                      \
  } while (0)

#endif  // CORE_CUDA_CUDA_STATUS_H_
