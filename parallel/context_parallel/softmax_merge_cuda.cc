// Registers the CUDA kernel of MergeAttentionPartial. The kernel lives with
// the other CUDA kernels (//core/ops/cuda:kernels, merge_attention.h); its
// slot lives here, above core, so the registration does too. Linking this
// library (alwayslink) is all a binary needs.
#include "absl/status/status.h"
#include "core/ops/cuda/launch.h"
#include "core/ops/cuda/merge_attention.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "parallel/context_parallel/softmax_merge.h"

namespace mcc {
namespace context_parallel {
namespace {

// The op has validated the shapes (out [b, s, heads, d], lse [b, heads, s],
// parts alike), the fp32 dtypes and the one device.
absl::Status MergeAttentionPartialCuda(const Tensor& part_out,
                                       const Tensor& part_lse, Tensor* out,
                                       Tensor* lse) {
  ops::cuda::KernelScope s("MergeAttentionPartial", *out);
  MCC_RETURN_IF_ERROR(s.status());
  if (out->numel() == 0) return absl::OkStatus();
  return s.Check(cuda_kernels::MergeAttentionPartial(
      static_cast<const float*>(part_out.raw_data()),
      static_cast<const float*>(part_lse.raw_data()),
      static_cast<float*>(out->raw_data()),
      static_cast<float*>(lse->raw_data()), out->size(0), out->size(1),
      out->size(2), out->size(3), s.stream()));
}

const bool kRegistered = [] {
  MergeAttentionPartialKernels().Register(DeviceType::kCUDA,
                                          &MergeAttentionPartialCuda);
  return true;
}();

}  // namespace
}  // namespace context_parallel
}  // namespace mcc
