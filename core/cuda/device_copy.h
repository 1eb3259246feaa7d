#ifndef CORE_CUDA_DEVICE_COPY_H_
#define CORE_CUDA_DEVICE_COPY_H_

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"
#include "core/device.h"

namespace mcc {
namespace cuda {

// Copies bytes between host and device or between devices on `stream`.
// Copies that involve the host return once the copy is complete (the host
// buffer may be reused at once); device-to-device copies are ordered on
// `stream` and do not block the host. Peers on different devices are copied
// with cudaMemcpyPeerAsync. Errors name both devices, the size and the CUDA
// error.
absl::Status Copy(void* dst, Device dst_device, const void* src,
                  Device src_device, size_t bytes, cudaStream_t stream);

// Copy on the current stream of the CUDA device involved (the destination's
// when both are GPUs). This is what this library registers with
// RegisterDeviceCopy, so Tensor::CopyFrom and Tensor::To(Device) work for
// CUDA tensors; there a failure is fatal, as the hook returns nothing.
absl::Status CopyOnCurrentStream(void* dst, Device dst_device, const void* src,
                                 Device src_device, size_t bytes);

}  // namespace cuda
}  // namespace mcc

#endif  // CORE_CUDA_DEVICE_COPY_H_
