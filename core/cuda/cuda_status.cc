#include "core/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace mcc {
namespace cuda {

absl::Status CudaErrorToStatus(cudaError_t error, const char* call,
                               const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(call, " failed at ", file, ":", line,
                                           ": ", cudaGetErrorName(error), " (",
                                           cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
      return absl::FailedPreconditionError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace cuda
}  // namespace mcc
