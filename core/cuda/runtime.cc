#include "core/cuda/runtime.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/cuda/cuda_status.h"
#include "glog/logging.h"

namespace mcc {
namespace cuda {

namespace {

struct DeviceCount {
  int count = 0;
  std::string why_none;  // Empty when count > 0.
};

const DeviceCount& CountDevices() {
  static const DeviceCount* result = [] {
    auto* r = new DeviceCount;
    const cudaError_t error = cudaGetDeviceCount(&r->count);
    if (error != cudaSuccess) {
      (void)cudaGetLastError();  // Clear the error so later calls start clean.
      r->count = 0;
    }
    r->why_none = NoDeviceReason(error, r->count);
    if (r->count == 0 && CudaExpected()) {
      // The GPU checks set MCC_EXPECT_CUDA: a skip there would read as a
      // pass, so a process that sees no device dies saying why.
      LOG(FATAL) << "MCC_EXPECT_CUDA is set but no CUDA device is usable: "
                 << r->why_none;
    }
    VLOG(1) << (r->count > 0 ? "CUDA devices: " : "")
            << (r->count > 0 ? std::to_string(r->count) : r->why_none);
    return r;
  }();
  return *result;
}

}  // namespace

std::string NoDeviceReason(int error_code, int count) {
  const auto error = static_cast<cudaError_t>(error_code);
  if (error != cudaSuccess) {
    return absl::StrCat("cudaGetDeviceCount failed with ",
                        cudaGetErrorName(error), " (",
                        cudaGetErrorString(error), ")");
  }
  if (count == 0) return "cudaGetDeviceCount found 0 devices";
  return "";
}

bool CudaExpected() {
  const char* value = std::getenv("MCC_EXPECT_CUDA");
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

int CudaDeviceCount() { return CountDevices().count; }

std::string NoCudaDeviceReason() { return CountDevices().why_none; }

absl::Status CheckDeviceIndex(int index) {
  const int count = CudaDeviceCount();
  if (index < 0 || index >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no CUDA device: cuda:", index, " requested, ", count,
        count == 1 ? " device" : " devices", " present",
        count == 0 ? absl::StrCat(" (", NoCudaDeviceReason(), ")") : ""));
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

absl::StatusOr<int64_t> FreeMemoryBytes(int index) {
  if (absl::Status s = CheckDeviceIndex(index); !s.ok()) return s;
  DeviceGuard guard(index);
  size_t free_bytes = 0, total_bytes = 0;
  MCC_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
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
