#include "core/ops/cuda/launch.h"

#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/stream.h"

namespace mcc {
namespace ops {
namespace cuda {

KernelScope::KernelScope(const char* op, const Tensor& t)
    : op_(op), device_(t.device().index) {
  const absl::Status exists = ::mcc::cuda::CheckDeviceIndex(device_);
  if (!exists.ok()) {
    status_ =
        absl::Status(exists.code(), absl::StrCat(op_, ": ", exists.message()));
    return;
  }
  guard_.emplace(device_);
}

cudaStream_t KernelScope::stream() const {
  return ::mcc::cuda::CurrentStream(device_);
}

absl::Status KernelScope::Check(cudaError_t error) const {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  const absl::Status s = ::mcc::cuda::CudaErrorToStatus(error, "kernel launch",
                                                        __FILE__, __LINE__);
  return absl::Status(s.code(), absl::StrCat(op_, " on cuda:", device_, ": ",
                                             cudaGetErrorName(error), " (",
                                             cudaGetErrorString(error), ")"));
}

cuda_kernels::ElemType ElemTypeOf(const Tensor& t) {
  switch (t.dtype()) {
    case DType::kFloat32:
      return cuda_kernels::ElemType::kF32;
    case DType::kBFloat16:
      return cuda_kernels::ElemType::kBF16;
    case DType::kFloat16:
      return cuda_kernels::ElemType::kF16;
    case DType::kInt32:
      return cuda_kernels::ElemType::kI32;
    case DType::kInt64:
      return cuda_kernels::ElemType::kI64;
    case DType::kInt8:
      return cuda_kernels::ElemType::kI8;
  }
  return cuda_kernels::ElemType::kF32;
}

}  // namespace cuda
}  // namespace ops
}  // namespace mcc
