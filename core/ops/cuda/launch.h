// What every CUDA kernel of //core/ops/cuda:registrations does around its
// launch: check that the tensors' device exists (an error naming the op, not
// a crash, on a machine without one), make it the current device for the
// call, find the device's current stream, and turn a launch error into a
// Status that names the op and the device.
#ifndef CORE_OPS_CUDA_LAUNCH_H_
#define CORE_OPS_CUDA_LAUNCH_H_

#include <cuda_runtime.h>

#include <optional>

#include "absl/status/status.h"
#include "core/cuda/runtime.h"
#include "core/ops/cuda/elem_type.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {
namespace cuda {

// Lives for one kernel call on the thread that makes it.
class KernelScope {
 public:
  // `op` names the op in errors (a string literal); `t` is one of its
  // tensors (all are on one device: the op has checked).
  KernelScope(const char* op, const Tensor& t);
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

  // OK, or FailedPrecondition "Gelu: no CUDA device: cuda:0 requested, 0
  // present" when the device does not exist (then nothing may be launched).
  const absl::Status& status() const { return status_; }
  int device() const { return device_; }
  // The device's current stream for this thread (core/cuda/stream.h).
  cudaStream_t stream() const;
  // OK for cudaSuccess; otherwise the error, naming the op and the device
  // (and clearing CUDA's sticky last error).
  absl::Status Check(cudaError_t error) const;

 private:
  const char* op_;
  int device_;
  absl::Status status_;
  std::optional<::mcc::cuda::DeviceGuard> guard_;
};

// The launcher element type of a tensor's dtype.
cuda_kernels::ElemType ElemTypeOf(const Tensor& t);

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_LAUNCH_H_
