// The CUDA device's side-stream hooks (core/side_stream.h): a non-blocking
// cudaStream_t beside the current stream, events without timing, and
// cudaMemcpyAsync between pinned host memory and the device on the side
// stream. Registered when this library is linked; used by activation
// offloading (core/activation_offload.h).
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/side_stream.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace cuda {
namespace {

cudaStream_t StreamOr(Device device, void* stream) {
  return stream != nullptr ? static_cast<cudaStream_t>(stream)
                           : CurrentStream(device.index);
}

void* CreateSideStream(Device device) {
  if (!CheckDeviceIndex(device.index).ok()) return nullptr;
  DeviceGuard guard(device.index);
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) !=
      cudaSuccess) {
    cudaGetLastError();  // Clears the error for later calls.
    return nullptr;
  }
  return stream;
}

void DestroySideStream(Device device, void* stream) {
  DeviceGuard guard(device.index);
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaStreamSynchronize(s);
  if (e == cudaSuccess) e = cudaStreamDestroy(s);
  LOG_IF(ERROR, e != cudaSuccess) << "side stream on " << device.ToString()
                                  << ": " << cudaGetErrorString(e);
}

absl::Status RecordEvent(Device device, void* stream, void** event) {
  MCC_RETURN_IF_ERROR(CheckDeviceIndex(device.index));
  DeviceGuard guard(device.index);
  cudaEvent_t e = nullptr;
  MCC_CUDA_RETURN_IF_ERROR(
      cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(e, StreamOr(device, stream));
  if (recorded != cudaSuccess) {
    cudaEventDestroy(e);
    return CudaErrorToStatus(recorded, "cudaEventRecord", __FILE__, __LINE__);
  }
  *event = e;
  return absl::OkStatus();
}

absl::Status WaitEvent(Device device, void* event, void* stream) {
  DeviceGuard guard(device.index);
  MCC_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(
      StreamOr(device, stream), static_cast<cudaEvent_t>(event), 0));
  return absl::OkStatus();
}

absl::Status SynchronizeEvent(Device device, void* event) {
  DeviceGuard guard(device.index);
  MCC_CUDA_RETURN_IF_ERROR(
      cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  return absl::OkStatus();
}

void DestroyEvent(Device device, void* event) {
  DeviceGuard guard(device.index);
  const cudaError_t e = cudaEventDestroy(static_cast<cudaEvent_t>(event));
  LOG_IF(ERROR, e != cudaSuccess) << "cudaEventDestroy on " << device.ToString()
                                  << ": " << cudaGetErrorString(e);
}

absl::Status CopyAsync(Device device, void* stream, void* dst, const void* src,
                       size_t bytes, bool to_host) {
  DeviceGuard guard(device.index);
  const cudaError_t e =
      cudaMemcpyAsync(dst, src, bytes,
                      to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                      static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) {
    return absl::InternalError(absl::StrCat(
        "cudaMemcpyAsync of ", bytes, " bytes ", to_host ? "from " : "to ",
        device.ToString(), " on a side stream: ", cudaGetErrorString(e)));
  }
  return absl::OkStatus();
}

const bool registered = [] {
  SideStreamHooks hooks;
  hooks.create_stream = &CreateSideStream;
  hooks.destroy_stream = &DestroySideStream;
  hooks.record_event = &RecordEvent;
  hooks.wait_event = &WaitEvent;
  hooks.synchronize_event = &SynchronizeEvent;
  hooks.destroy_event = &DestroyEvent;
  hooks.copy_async = &CopyAsync;
  MCC_CHECK_OK(RegisterSideStreamHooks(DeviceType::kCUDA, hooks));
  return true;
}();

}  // namespace
}  // namespace cuda
}  // namespace mcc
