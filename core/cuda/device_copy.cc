#include "core/cuda/device_copy.h"

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "glog/logging.h"

namespace mcc {
namespace cuda {
namespace {

absl::Status Annotate(const absl::Status& status, Device dst, Device src,
                      size_t bytes) {
  if (status.ok()) return status;
  return absl::Status(
      status.code(),
      absl::StrCat("copy of ", bytes, " bytes from ", src.ToString(), " to ",
                   dst.ToString(), ": ", status.message()));
}

absl::Status CopyImpl(void* dst, Device dst_device, const void* src,
                      Device src_device, size_t bytes, cudaStream_t stream) {
  if (dst_device.is_cuda())
    MCC_RETURN_IF_ERROR(CheckDeviceIndex(dst_device.index));
  if (src_device.is_cuda())
    MCC_RETURN_IF_ERROR(CheckDeviceIndex(src_device.index));
  const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  DeviceGuard guard(device);
  if (dst_device.is_cuda() && src_device.is_cuda()) {
    if (dst_device.index == src_device.index) {
      MCC_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      MCC_CUDA_RETURN_IF_ERROR(cudaMemcpyPeerAsync(
          dst, dst_device.index, src, src_device.index, bytes, stream));
    }
    return absl::OkStatus();
  }
  const cudaMemcpyKind kind =
      dst_device.is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  MCC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, stream));
  MCC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

}  // namespace

absl::Status Copy(void* dst, Device dst_device, const void* src,
                  Device src_device, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    return CopyBytes(dst, dst_device, src, src_device, bytes);
  }
  return Annotate(CopyImpl(dst, dst_device, src, src_device, bytes, stream),
                  dst_device, src_device, bytes);
}

absl::Status CopyOnCurrentStream(void* dst, Device dst_device, const void* src,
                                 Device src_device, size_t bytes) {
  const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  if (device < 0 || device >= CudaDeviceCount()) {
    return Annotate(CheckDeviceIndex(device), dst_device, src_device, bytes);
  }
  return Copy(dst, dst_device, src, src_device, bytes, CurrentStream(device));
}

namespace {

const bool registered = [] {
  RegisterDeviceCopy(DeviceType::kCUDA, &CopyOnCurrentStream);
  return true;
}();

}  // namespace

}  // namespace cuda
}  // namespace mcc
