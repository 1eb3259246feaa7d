#include "parallel/context_parallel/softmax_merge.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/thread_pool.h"

namespace mcc {
namespace context_parallel {
namespace {

constexpr const char* kOp = "MergeAttentionPartial";

absl::Status CheckF32(const char* name, const Tensor* t, const Shape& shape,
                      Device device) {
  if (t == nullptr || !t->defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": ", name, " is not defined"));
  }
  if (t->dtype() != DType::kFloat32 || t->shape() != shape ||
      t->device() != device) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": ", name, " ", t->Describe(), " must be fp32 ",
                     ShapeToString(shape), " on ", device.ToString()));
  }
  return absl::OkStatus();
}

absl::Status MergeCpu(const Tensor& part_out, const Tensor& part_lse,
                      Tensor* out, Tensor* lse) {
  const int64_t b = out->size(0), s = out->size(1), h = out->size(2),
                d = out->size(3);
  const float* po = part_out.data<float>();
  const float* pl = part_lse.data<float>();
  float* o = out->data<float>();
  float* l = lse->data<float>();
  ThreadPool::Global().ParallelFor(b * s, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t bi = r / s, t = r % s;
      for (int64_t hi = 0; hi < h; ++hi) {
        const int64_t li = (bi * h + hi) * s + t;
        const float a = l[li], c = pl[li];
        const float m = std::max(a, c);
        if (m == -std::numeric_limits<float>::infinity()) continue;
        const float merged = m + std::log(std::exp(a - m) + std::exp(c - m));
        const float wa = std::exp(a - merged), wc = std::exp(c - merged);
        float* orow = o + (r * h + hi) * d;
        const float* prow = po + (r * h + hi) * d;
        for (int64_t x = 0; x < d; ++x) orow[x] = wa * orow[x] + wc * prow[x];
        l[li] = merged;
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status MergeAttentionPartial(const Tensor& part_out,
                                   const Tensor& part_lse, Tensor* out,
                                   Tensor* lse) {
  if (out == nullptr || !out->defined() || out->dim() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": out ", out ? out->Describe() : "null",
                     " must be [batch, seq, heads, head_dim]"));
  }
  const Device device = out->device();
  const Shape lse_shape{out->size(0), out->size(2), out->size(1)};
  if (absl::Status s = CheckF32("out", out, out->shape(), device); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckF32("part_out", &part_out, out->shape(), device);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckF32("lse", lse, lse_shape, device); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckF32("part_lse", &part_lse, lse_shape, device);
      !s.ok()) {
    return s;
  }
  if (out->numel() == 0) return absl::OkStatus();
  return MergeAttentionPartialKernels()(device, part_out, part_lse, out, lse);
}

MCC_KERNEL_SLOT(MergeAttentionPartialKernel, MergeAttentionPartialKernels, kOp,
                &MergeCpu);

}  // namespace context_parallel
}  // namespace mcc
