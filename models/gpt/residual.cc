#include "models/gpt/residual.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/ops/kernel_util.h"
#include "core/thread_pool.h"

namespace mcc {
namespace gpt {

absl::Status AddResidual(const Tensor& a, const Tensor& b, Tensor* y) {
  if (a.shape() != b.shape() || a.shape() != y->shape() ||
      a.dtype() != b.dtype() || a.dtype() != y->dtype() ||
      !a.device().is_cpu() ||
      (a.dtype() != DType::kFloat32 && a.dtype() != DType::kBFloat16 &&
       a.dtype() != DType::kFloat16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "residual add: ", a.Describe(), " + ", b.Describe(), " -> ",
        y->Describe(), ": need equal shapes, fp32, bf16 or fp16, on the CPU"));
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
    // 16-bit: widen blocks to fp32, add, round once (vectorised).
    ops::DispatchFloat(a.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* ap = a.data<T>();
      const T* bp = b.data<T>();
      T* yp = y->data<T>();
      ops::ParallelForElements(n, [&](int64_t s, int64_t e) {
        float abuf[ops::kBlock], bbuf[ops::kBlock], ybuf[ops::kBlock];
        for (int64_t i = s; i < e; i += ops::kBlock) {
          const int64_t m = std::min(ops::kBlock, e - i);
          const float* af = ops::AsF32(ap + i, m, abuf);
          const float* bf = ops::AsF32(bp + i, m, bbuf);
          for (int64_t j = 0; j < m; ++j) ybuf[j] = af[j] + bf[j];
          ops::StoreF32(ybuf, yp + i, m);
        }
      });
    });
  }
  return absl::OkStatus();
}

}  // namespace gpt
}  // namespace mcc
