#include "core/ops/cached_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

absl::Status CachedAttentionCpu(const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache, int64_t position,
                                Tensor* out) {
  const int64_t b = q.size(0), n = q.size(1), heads = q.size(2), d = q.size(3);
  const int64_t groups = k_cache.size(2), cap = k_cache.size(1);
  const int64_t per_group = heads / groups;
  std::vector<float> qf(q.numel());
  ConvertElements(q.raw_data(), q.dtype(), qf.data(), DType::kFloat32,
                  q.numel());
  const bool f32_out = out->dtype() == DType::kFloat32;
  std::vector<float> staged(f32_out ? 0 : out->numel());
  const float* qp = qf.data();
  const float* kp = k_cache.data<float>();
  const float* vp = v_cache.data<float>();
  float* op = f32_out ? out->data<float>() : staged.data();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ThreadPool::Global().ParallelFor(
      b * n * heads, 1, [&](int64_t t0, int64_t t1) {
        std::vector<float> scores(position + n);
        std::vector<float> acc(d);
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t h = t % heads, i = (t / heads) % n,
                        bi = t / (heads * n);
          const int64_t g = h / per_group;
          const int64_t keys = position + i + 1;
          const float* qrow = qp + ((bi * n + i) * heads + h) * d;
          float max_score = -INFINITY;
          for (int64_t j = 0; j < keys; ++j) {
            const float* krow = kp + ((bi * cap + j) * groups + g) * d;
            float dot = 0;
            for (int64_t e = 0; e < d; ++e) dot += qrow[e] * krow[e];
            scores[j] = dot * scale;
            max_score = std::max(max_score, scores[j]);
          }
          float sum = 0;
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = 0; j < keys; ++j) {
            const float p = std::exp(scores[j] - max_score);
            sum += p;
            const float* vrow = vp + ((bi * cap + j) * groups + g) * d;
            for (int64_t e = 0; e < d; ++e) acc[e] += p * vrow[e];
          }
          float* orow = op + ((bi * n + i) * heads + h) * d;
          for (int64_t e = 0; e < d; ++e) orow[e] = acc[e] / sum;
        }
      });
  if (!f32_out) {
    ConvertElements(staged.data(), DType::kFloat32, out->raw_data(),
                    out->dtype(), out->numel());
  }
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(CachedAttentionKernel, CachedAttentionKernels,
                "CachedAttention", &CachedAttentionCpu);

absl::Status CachedAttention(const Tensor& q, const Tensor& k_cache,
                             const Tensor& v_cache, int64_t position,
                             Tensor* out) {
  ScopedOpTimer op_timer("CachedAttention");
  const char* op = "CachedAttention";
  MCC_RETURN_IF_ERROR(CheckDefined(
      op,
      {{"q", &q}, {"k_cache", &k_cache}, {"v_cache", &v_cache}, {"out", out}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(
      op,
      {{"q", &q}, {"k_cache", &k_cache}, {"v_cache", &v_cache}, {"out", out}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"q", &q}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"k_cache", &k_cache}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"v_cache", &v_cache}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"q", &q}, {"out", out}));
  MCC_RETURN_IF_ERROR(
      CheckShapeMatches(op, {"k_cache", &k_cache}, {"v_cache", &v_cache}));
  if (out->dtype() != q.dtype()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": out ", Brief(*out), " must have the dtype of q ", Brief(q)));
  }
  if (q.dim() != 4 || k_cache.dim() != 4 || k_cache.size(0) != q.size(0) ||
      k_cache.size(3) != q.size(3) || k_cache.size(2) <= 0 ||
      q.size(2) % k_cache.size(2) != 0 || position < 0 ||
      position + q.size(1) > k_cache.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": queries ", Brief(q), " at position ", position,
        " do not fit the cache ", Brief(k_cache),
        " ([b, n, heads, d] over [b, capacity, groups, d], heads a multiple "
        "of groups)"));
  }
  if (q.numel() == 0) return absl::OkStatus();
  return CachedAttentionKernels()(q.device(), q, k_cache, v_cache, position,
                                  out);
}

}  // namespace ops
}  // namespace mcc
