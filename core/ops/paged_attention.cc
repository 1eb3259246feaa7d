#include "core/ops/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/ops/sliding_window.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

absl::Status PagedKvWriteCpu(const Tensor& k, const Tensor& v,
                             const Tensor& slots, Tensor* k_pool,
                             Tensor* v_pool) {
  const int64_t rows = k.size(0), row = k.size(1) * k.size(2);
  const int64_t pool_slots = k_pool->size(0) * k_pool->size(1);
  const int64_t* s = slots.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    if (s[r] < 0 || s[r] >= pool_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("PagedKvWrite: slot ", s[r], " of row ", r,
                       " is outside the pool of ", pool_slots, " slots"));
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(k_pool->data<float>() + s[r] * row, k.data<float>() + r * row,
                row * sizeof(float));
    std::memcpy(v_pool->data<float>() + s[r] * row, v.data<float>() + r * row,
                row * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status PagedAttentionCpu(const Tensor& q, const Tensor& k_pool,
                               const Tensor& v_pool, const Tensor& block_tables,
                               const Tensor& positions, Tensor* out,
                               int64_t window_left) {
  const int64_t rows = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t blocks = k_pool.size(0), bs = k_pool.size(1);
  const int64_t groups = k_pool.size(2), per_group = heads / groups;
  const int64_t max_blocks = block_tables.size(1);
  const int32_t* tables = block_tables.data<int32_t>();
  const int64_t* pos = positions.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    if (pos[r] < 0 || pos[r] / bs >= max_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PagedAttention: position ", pos[r], " of row ", r,
          " is outside its block table of ", max_blocks, " blocks of ", bs));
    }
    for (int64_t b = SlidingWindowFirstKey(pos[r], window_left) / bs;
         b <= pos[r] / bs; ++b) {
      const int32_t block = tables[r * max_blocks + b];
      if (block < 0 || block >= blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("PagedAttention: block ", block, " of row ", r,
                         " is outside the pool of ", blocks, " blocks"));
      }
    }
  }
  const float* qp = q.data<float>();
  const float* kp = k_pool.data<float>();
  const float* vp = v_pool.data<float>();
  float* op = out->data<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  ThreadPool::Global().ParallelFor(
      rows * heads, 1, [&](int64_t t0, int64_t t1) {
        std::vector<float> scores, acc(d);
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t r = t / heads, h = t % heads, g = h / per_group;
          const int64_t first = SlidingWindowFirstKey(pos[r], window_left);
          const int64_t keys = pos[r] + 1;
          const int32_t* table = tables + r * max_blocks;
          const float* qrow = qp + t * d;
          scores.resize(keys);
          float max_score = -INFINITY;
          for (int64_t j = first; j < keys; ++j) {
            const int64_t slot = table[j / bs] * bs + j % bs;
            const float* krow = kp + (slot * groups + g) * d;
            float dot = 0;
            for (int64_t e = 0; e < d; ++e)
              dot = std::fma(qrow[e], krow[e], dot);
            scores[j] = dot * scale;
            max_score = std::max(max_score, scores[j]);
          }
          float sum = 0;
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = first; j < keys; ++j) {
            const float p = std::exp(scores[j] - max_score);
            sum += p;
            const int64_t slot = table[j / bs] * bs + j % bs;
            const float* vrow = vp + (slot * groups + g) * d;
            for (int64_t e = 0; e < d; ++e)
              acc[e] = std::fma(p, vrow[e], acc[e]);
          }
          float* orow = op + t * d;
          for (int64_t e = 0; e < d; ++e) orow[e] = acc[e] / sum;
        }
      });
  return absl::OkStatus();
}

absl::Status RotaryAtPositionsCpu(const Tensor& x, const Tensor& positions,
                                  const RotaryOptions& options, Tensor* y) {
  const int64_t rows = x.size(0), heads = x.size(1), d = x.size(2);
  const int64_t rd = options.rotary_dim == 0 ? d : options.rotary_dim;
  const int64_t half = rd / 2;
  const std::vector<double> inv_freq = RotaryInverseFrequencies(options, rd);
  const int64_t* pos = positions.data<int64_t>();
  std::vector<float> xf(x.numel());
  ConvertElements(x.raw_data(), x.dtype(), xf.data(), DType::kFloat32,
                  x.numel());
  std::vector<float> c(half), s(half);
  for (int64_t r = 0; r < rows; ++r) {
    // The angles as RotaryForward's table computes them (float64, then
    // rounded to fp32).
    for (int64_t i = 0; i < half; ++i) {
      const double theta = static_cast<double>(pos[r]) * inv_freq[i];
      c[i] = static_cast<float>(std::cos(theta));
      s[i] = static_cast<float>(std::sin(theta));
    }
    for (int64_t hh = 0; hh < heads; ++hh) {
      float* v = xf.data() + (r * heads + hh) * d;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = v[i], x2 = v[half + i];
        v[i] = x1 * c[i] - x2 * s[i];
        v[half + i] = x2 * c[i] + x1 * s[i];
      }
    }
  }
  ConvertElements(xf.data(), DType::kFloat32, y->raw_data(), y->dtype(),
                  y->numel());
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(PagedKvWriteKernel, PagedKvWriteKernels, "PagedKvWrite",
                &PagedKvWriteCpu);
MCC_KERNEL_SLOT(PagedAttentionKernel, PagedAttentionKernels, "PagedAttention",
                &PagedAttentionCpu);
MCC_KERNEL_SLOT(RotaryAtPositionsKernel, RotaryAtPositionsKernels,
                "RotaryAtPositions", &RotaryAtPositionsCpu);

absl::Status PagedKvWrite(const Tensor& k, const Tensor& v, const Tensor& slots,
                          Tensor* k_pool, Tensor* v_pool) {
  ScopedOpTimer op_timer("PagedKvWrite");
  const char* op = "PagedKvWrite";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"k", &k},
                                        {"v", &v},
                                        {"slots", &slots},
                                        {"k_pool", k_pool},
                                        {"v_pool", v_pool}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"k", &k},
                                           {"v", &v},
                                           {"slots", &slots},
                                           {"k_pool", k_pool},
                                           {"v_pool", v_pool}}));
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"k", &k},
                                {"v", &v},
                                {"k_pool", k_pool},
                                {"v_pool", v_pool}}) {
    MCC_RETURN_IF_ERROR(CheckDType(op, {name, t}, DType::kFloat32));
  }
  MCC_RETURN_IF_ERROR(CheckDType(op, {"slots", &slots}, DType::kInt64));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"k", &k}, {"v", &v}));
  MCC_RETURN_IF_ERROR(
      CheckShapeMatches(op, {"k_pool", k_pool}, {"v_pool", v_pool}));
  if (k.dim() != 3 || k_pool->dim() != 4 || slots.dim() != 1 ||
      slots.size(0) != k.size(0) || k_pool->size(2) != k.size(1) ||
      k_pool->size(3) != k.size(2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": k ", Brief(k), " and slots ", Brief(slots),
        " do not fit the pool ", Brief(*k_pool),
        " ([rows, groups, d] and [rows] into [blocks, block_size, groups, "
        "d])"));
  }
  if (k.numel() == 0) return absl::OkStatus();
  return PagedKvWriteKernels()(k.device(), k, v, slots, k_pool, v_pool);
}

absl::Status PagedAttention(const Tensor& q, const Tensor& k_pool,
                            const Tensor& v_pool, const Tensor& block_tables,
                            const Tensor& positions, Tensor* out,
                            int64_t window_left) {
  ScopedOpTimer op_timer("PagedAttention");
  const char* op = "PagedAttention";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"q", &q},
                                        {"k_pool", &k_pool},
                                        {"v_pool", &v_pool},
                                        {"block_tables", &block_tables},
                                        {"positions", &positions},
                                        {"out", out}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"q", &q},
                                           {"k_pool", &k_pool},
                                           {"v_pool", &v_pool},
                                           {"block_tables", &block_tables},
                                           {"positions", &positions},
                                           {"out", out}}));
  for (const auto& [name, t] : {std::pair<const char*, const Tensor*>{"q", &q},
                                {"k_pool", &k_pool},
                                {"v_pool", &v_pool},
                                {"out", out}}) {
    MCC_RETURN_IF_ERROR(CheckDType(op, {name, t}, DType::kFloat32));
  }
  MCC_RETURN_IF_ERROR(
      CheckDType(op, {"block_tables", &block_tables}, DType::kInt32));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"positions", &positions}, DType::kInt64));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"q", &q}, {"out", out}));
  MCC_RETURN_IF_ERROR(
      CheckShapeMatches(op, {"k_pool", &k_pool}, {"v_pool", &v_pool}));
  if (q.dim() != 3 || k_pool.dim() != 4 || block_tables.dim() != 2 ||
      positions.dim() != 1 || block_tables.size(0) != q.size(0) ||
      positions.size(0) != q.size(0) || k_pool.size(3) != q.size(2) ||
      k_pool.size(2) <= 0 || q.size(1) % k_pool.size(2) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": queries ", Brief(q), " with tables ", Brief(block_tables),
        " and positions ", Brief(positions), " do not fit the pool ",
        Brief(k_pool),
        " ([rows, heads, d], [rows, max_blocks], [rows] over [blocks, "
        "block_size, groups, d], heads a multiple of groups)"));
  }
  if (q.numel() == 0) return absl::OkStatus();
  return PagedAttentionKernels()(q.device(), q, k_pool, v_pool, block_tables,
                                 positions, out, window_left);
}

absl::Status RotaryAtPositions(const Tensor& x, const Tensor& positions,
                               const RotaryOptions& options, Tensor* y) {
  ScopedOpTimer op_timer("RotaryAtPositions");
  const char* op = "RotaryAtPositions";
  MCC_RETURN_IF_ERROR(
      CheckDefined(op, {{"x", &x}, {"positions", &positions}, {"y", y}}));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"x", &x}, {"positions", &positions}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"y", y}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"positions", &positions}, DType::kInt64));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"x", &x}, {"y", y}));
  const int64_t d = x.dim() == 3 ? x.size(2) : 0;
  const int64_t rd = options.rotary_dim == 0 ? d : options.rotary_dim;
  if (x.dim() != 3 || positions.dim() != 1 || positions.size(0) != x.size(0) ||
      rd <= 0 || rd > d || rd % 2 != 0 || !(options.base > 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": x ", Brief(x), " with positions ", Brief(positions),
        " and rotary_dim ", options.rotary_dim,
        " must be [rows, heads, d] and [rows], rotary_dim even and at most "
        "d, base positive"));
  }
  MCC_RETURN_IF_ERROR(ValidateLlama3RopeScaling(options.llama3));
  if (x.numel() == 0) return absl::OkStatus();
  return RotaryAtPositionsKernels()(x.device(), x, positions, options, y);
}

}  // namespace ops
}  // namespace mcc
