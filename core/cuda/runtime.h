#ifndef CORE_CUDA_RUNTIME_H_
#define CORE_CUDA_RUNTIME_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace mcc {
namespace cuda {

// Number of CUDA devices this process can use; 0 (not an error) when there
// is no driver or no device. Counted once per process. When the environment
// sets MCC_EXPECT_CUDA (to anything but "" or "0"; tools/gpu/run_checks.sh
// does on a GPU machine) a count of 0 is fatal, naming NoCudaDeviceReason():
// there a test that skips for want of a device must fail, not pass.
int CudaDeviceCount();

// Why CudaDeviceCount() is 0: "cudaGetDeviceCount failed with
// cudaErrorInsufficientDriver (CUDA driver version is insufficient for CUDA
// runtime version)", or "cudaGetDeviceCount found 0 devices"; "" when
// devices are present.
std::string NoCudaDeviceReason();

// The reason above for a cudaGetDeviceCount result: its cudaError_t and
// count (exposed for tests).
std::string NoDeviceReason(int error, int count);

// Whether MCC_EXPECT_CUDA asks for a CUDA device.
bool CudaExpected();

// OK when cuda:index exists; otherwise FailedPrecondition naming the device
// and the number present, e.g. "no CUDA device: cuda:0 requested, 0 devices
// present (cudaGetDeviceCount found 0 devices)".
absl::Status CheckDeviceIndex(int index);

// "NVIDIA H200 (sm_90, 139.8 GiB)"; an error when the device is absent.
absl::StatusOr<std::string> DeviceDescription(int index);

// The device's free memory as the driver reports it (cudaMemGetInfo; the
// caching allocator's cached blocks count as used).
absl::StatusOr<int64_t> FreeMemoryBytes(int index);

// Waits for all work on the device.
absl::Status Synchronize(int index);

// Makes `index` the current CUDA device for its scope, restoring the previous
// one after. Does nothing (and touches no driver) when index < 0.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Tensor::Empty on a CUDA device with an error instead of a crash when the
// device does not exist: "no CUDA device: cannot allocate fp32[3, 5] on
// cuda:0 (0 devices present)". Out-of-memory still dies, with the
// allocator's statistics, as Tensor::Empty documents.
absl::StatusOr<Tensor> EmptyOn(Shape shape, DType dtype, Device device);

}  // namespace cuda
}  // namespace mcc

#endif  // CORE_CUDA_RUNTIME_H_
