#include "models/gpt/residual.h"

#include "absl/strings/str_cat.h"
#include "core/thread_pool.h"

namespace mcc {
namespace gpt {

absl::Status AddResidual(const Tensor& a, const Tensor& b, Tensor* y) {
  if (a.shape() != b.shape() || a.shape() != y->shape() ||
      a.dtype() != b.dtype() || a.dtype() != y->dtype() ||
      !a.device().is_cpu() ||
      (a.dtype() != DType::kFloat32 && a.dtype() != DType::kBFloat16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "residual add: ", a.Describe(), " + ", b.Describe(), " -> ",
        y->Describe(), ": need equal shapes, fp32 or bf16, on the CPU"));
  }
  const int64_t n = a.numel();
  if (a.dtype() == DType::kFloat32) {
    const float* ap = a.data<float>();
    const float* bp = b.data<float>();
    float* yp = y->data<float>();
    ThreadPool::Global().ParallelFor(n, 1 << 14, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) yp[i] = ap[i] + bp[i];
    });
  } else {
    const BFloat16* ap = a.data<BFloat16>();
    const BFloat16* bp = b.data<BFloat16>();
    BFloat16* yp = y->data<BFloat16>();
    ThreadPool::Global().ParallelFor(n, 1 << 14, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        yp[i] =
            FloatToBFloat16(BFloat16ToFloat(ap[i]) + BFloat16ToFloat(bp[i]));
      }
    });
  }
  return absl::OkStatus();
}

}  // namespace gpt
}  // namespace mcc
