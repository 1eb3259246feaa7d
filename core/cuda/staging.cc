// The CUDA device's staging hooks (core/device_staging.h): page-locked host
// memory from cudaHostAlloc, host-to-device copies issued with
// cudaMemcpyAsync on the device's current stream without waiting, and a
// synchronisation of that stream. Registered when this library is linked.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/device_staging.h"
#include "core/status_macros.h"

namespace mcc {
namespace cuda {
namespace {

void* AllocatePinned(Device device, size_t bytes) {
  if (!CheckDeviceIndex(device.index).ok()) return nullptr;
  DeviceGuard guard(device.index);
  void* ptr = nullptr;
  if (cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocDefault) !=
      cudaSuccess) {
    cudaGetLastError();  // Clears the error for later calls.
    return nullptr;
  }
  return ptr;
}

void FreePinned(Device, void* ptr) { cudaFreeHost(ptr); }

absl::Status CopyAsync(void* dst, Device device, const void* pinned_src,
                       size_t bytes) {
  MCC_RETURN_IF_ERROR(CheckDeviceIndex(device.index));
  DeviceGuard guard(device.index);
  const cudaError_t e =
      cudaMemcpyAsync(dst, pinned_src, bytes, cudaMemcpyHostToDevice,
                      CurrentStream(device.index));
  if (e != cudaSuccess) {
    return absl::InternalError(absl::StrCat(
        "asynchronous copy of ", bytes, " bytes from pinned host memory to ",
        device.ToString(), ": ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

absl::Status SynchronizeCurrent(Device device) {
  MCC_RETURN_IF_ERROR(CheckDeviceIndex(device.index));
  DeviceGuard guard(device.index);
  MCC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(CurrentStream(device.index)));
  return absl::OkStatus();
}

const bool registered = [] {
  StagingHooks hooks;
  hooks.allocate_pinned = &AllocatePinned;
  hooks.free_pinned = &FreePinned;
  hooks.copy_async = &CopyAsync;
  hooks.synchronize = &SynchronizeCurrent;
  RegisterStagingHooks(DeviceType::kCUDA, hooks);
  return true;
}();

}  // namespace
}  // namespace cuda
}  // namespace mcc
