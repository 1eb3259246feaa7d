#include "core/cuda/runtime.h"

#include <cuda_runtime.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/cuda/cuda_status.h"
#include "glog/logging.h"

namespace mcc {
namespace cuda {

int CudaDeviceCount() {
  static const int count = [] {
    int n = 0;
    const cudaError_t error = cudaGetDeviceCount(&n);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();  // Clear the error so later calls start clean.
      VLOG(1) << "cudaGetDeviceCount: " << cudaGetErrorName(error) << " ("
              << cudaGetErrorString(error) << "); using 0 CUDA devices";
      return 0;
    }
    return n;
  }();
  return count;
}

absl::Status CheckDeviceIndex(int index) {
  const int count = CudaDeviceCount();
  if (index < 0 || index >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: cuda:", index, " requested, ", count,
                     count == 1 ? " device" : " devices", " present"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> DeviceDescription(int index) {
  if (absl::Status s = CheckDeviceIndex(index); !s.ok()) return s;
  cudaDeviceProp prop;
  MCC_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, index));
  return absl::StrFormat(
      "%s (sm_%d%d, %s)", prop.name, prop.major, prop.minor,
      FormatBytes(static_cast<int64_t>(prop.totalGlobalMem)));
}

absl::Status Synchronize(int index) {
  if (absl::Status s = CheckDeviceIndex(index); !s.ok()) return s;
  DeviceGuard guard(index);
  MCC_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

DeviceGuard::DeviceGuard(int index) {
  if (index < 0) return;
  int current = 0;
  MCC_CUDA_CHECK(cudaGetDevice(&current));
  if (current == index) return;
  previous_ = current;
  MCC_CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) MCC_CUDA_CHECK(cudaSetDevice(previous_));
}

absl::StatusOr<Tensor> EmptyOn(Shape shape, DType dtype, Device device) {
  if (device.is_cuda() &&
      (device.index < 0 || device.index >= CudaDeviceCount())) {
    return absl::FailedPreconditionError(
        absl::StrCat("no CUDA device: cannot allocate ", DTypeName(dtype),
                     ShapeToString(shape), " on ", device.ToString(), " (",
                     CudaDeviceCount(), " devices present)"));
  }
  return Tensor::Empty(std::move(shape), dtype, device);
}

}  // namespace cuda
}  // namespace mcc
