#include "core/ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/avx512_util.h"
#include "core/ops/cpu_isa.h"
#include "core/ops/nn_internal.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

using nn::Load8;
using nn::LoadS;

int64_t TargetAt(const Tensor& targets, int64_t i) {
  return targets.dtype() == DType::kInt32
             ? static_cast<int64_t>(targets.data<int32_t>()[i])
             : targets.data<int64_t>()[i];
}

// logits 2-D float.
absl::Status CheckLogits(absl::string_view op, const Tensor& logits) {
  MCC_RETURN_IF_ERROR(nn::Defined(op, "logits", &logits));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, "logits", logits));
  if (logits.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": logits must be [tokens, vocab], got ", logits.Describe()));
  }
  return absl::OkStatus();
}

// logits 2-D float, targets [tokens] int32/int64 on the same device.
absl::Status CheckLogitsAndTargetShapes(absl::string_view op,
                                        const Tensor& logits,
                                        const Tensor& targets) {
  MCC_RETURN_IF_ERROR(CheckLogits(op, logits));
  MCC_RETURN_IF_ERROR(nn::Defined(op, "targets", &targets));
  if (targets.dtype() != DType::kInt32 && targets.dtype() != DType::kInt64) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": targets must be int32 or int64, got ", targets.Describe()));
  }
  if (targets.dim() != 1 || targets.size(0) != logits.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": targets ", targets.Describe(),
                     " must be [tokens] for logits ", logits.Describe()));
  }
  return nn::SameDevice(op, "logits", logits, "targets", targets);
}

// Every target is in [0, vocab) or ignore_index: data, so the kernel checks
// it (on the CPU, before writing anything).
absl::Status CheckTargetRange(absl::string_view op, const Tensor& logits,
                              const Tensor& targets, int64_t ignore_index) {
  const int64_t vocab = logits.size(1);
  for (int64_t i = 0; i < targets.numel(); ++i) {
    const int64_t t = TargetAt(targets, i);
    if (t != ignore_index && (t < 0 || t >= vocab)) {
      return absl::OutOfRangeError(absl::StrCat(
          op, ": target ", t, " at token position ", i,
          " is outside the vocabulary [0, ", vocab, ") of logits ",
          logits.Describe(), " (ignore_index ", ignore_index, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPerToken(absl::string_view op, const char* name,
                           const Tensor* t, const Tensor& logits) {
  MCC_RETURN_IF_ERROR(nn::Defined(op, name, t));
  MCC_RETURN_IF_ERROR(nn::IsF32(op, name, *t));
  if (t->dim() != 1 || t->size(0) != logits.size(0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " ", t->Describe(), " must be [tokens] = [",
        logits.size(0), "] for logits ", logits.Describe()));
  }
  return nn::SameDevice(op, "logits", logits, name, *t);
}

// Maximum of x[0, n) (-inf when n is 0).
template <typename T>
float RowMax(const T* x, int64_t n) {
  __m256 vm = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) vm = _mm256_max_ps(vm, Load8(x + c));
  float mx = nn::HMax(vm);
  for (; c < n; ++c) mx = std::max(mx, LoadS(x + c));
  return mx;
}

template <typename T>
float RowLogSumExp(const T* x, int64_t n) {
  const float mx = RowMax(x, n);
  if (std::isinf(mx)) return mx;  // All -inf (or an inf): nothing to sum.
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    acc0 = _mm256_add_ps(acc0, nn::Exp8(_mm256_sub_ps(Load8(x + c), vmx)));
    acc1 = _mm256_add_ps(acc1, nn::Exp8(_mm256_sub_ps(Load8(x + c + 8), vmx)));
  }
  for (; c + 8 <= n; c += 8) {
    acc0 = _mm256_add_ps(acc0, nn::Exp8(_mm256_sub_ps(Load8(x + c), vmx)));
  }
  float sum = nn::HSum(_mm256_add_ps(acc0, acc1));
  for (; c < n; ++c) sum += std::exp(LoadS(x + c) - mx);
  return mx + std::log(sum);
}

int64_t RowGrain(int64_t vocab) {
  return std::max<int64_t>(1, 65536 / std::max<int64_t>(vocab, 1));
}

template <typename T, typename TT>
void ForwardCpu(const T* logits, const TT* targets, int64_t rows, int64_t vocab,
                int64_t ignore_index, float* loss, float* lse) {
  ThreadPool::Global().ParallelFor(
      rows, RowGrain(vocab), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* x = logits + r * vocab;
          const float l = RowLogSumExp(x, vocab);
          lse[r] = l;
          const int64_t t = targets[r];
          loss[r] = t == ignore_index ? 0.0f : l - LoadS(x + t);
        }
      });
}

template <typename T, typename TT, typename TO>
void BackwardCpu(const T* logits, const TT* targets, const float* lse,
                 const float* dloss, int64_t rows, int64_t vocab,
                 int64_t ignore_index, TO* dlogits) {
  ThreadPool::Global().ParallelFor(
      rows, RowGrain(vocab), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const T* x = logits + r * vocab;
          TO* dx = dlogits + r * vocab;
          const int64_t t = targets[r];
          if (t == ignore_index) {
            for (int64_t c = 0; c < vocab; ++c) nn::StoreS(dx + c, 0.0f);
            continue;
          }
          const float g = dloss[r];
          const float xt = LoadS(x + t);  // Before an in-place overwrite.
          const __m256 vl = _mm256_set1_ps(lse[r]);
          const __m256 vg = _mm256_set1_ps(g);
          int64_t c = 0;
          for (; c + 8 <= vocab; c += 8) {
            nn::Store8(
                dx + c,
                _mm256_mul_ps(nn::Exp8(_mm256_sub_ps(Load8(x + c), vl)), vg));
          }
          for (; c < vocab; ++c)
            nn::StoreS(dx + c, std::exp(LoadS(x + c) - lse[r]) * g);
          nn::StoreS(dx + t, (std::exp(xt - lse[r]) - 1.0f) * g);
        }
      });
}

template <typename F>
void DispatchTargets(DType dtype, F&& f) {
  if (dtype == DType::kInt32) {
    f(int32_t{});
  } else {
    f(int64_t{});
  }
}

}  // namespace

absl::Status CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                 Tensor* loss, Tensor* lse,
                                 int64_t ignore_index) {
  ScopedOpTimer op_timer("CrossEntropyForward");
  constexpr absl::string_view op = "CrossEntropyForward";
  MCC_RETURN_IF_ERROR(CheckLogitsAndTargetShapes(op, logits, targets));
  MCC_RETURN_IF_ERROR(CheckPerToken(op, "loss", loss, logits));
  MCC_RETURN_IF_ERROR(CheckPerToken(op, "lse", lse, logits));
  if (logits.size(0) != 0 && logits.size(1) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": empty vocabulary in logits ", logits.Describe()));
  }
  return CrossEntropyForwardKernels()(logits.device(), logits, targets, loss,
                                      lse, ignore_index);
}

namespace {

absl::Status CrossEntropyForwardCpu(const Tensor& logits, const Tensor& targets,
                                    Tensor* loss, Tensor* lse,
                                    int64_t ignore_index) {
  MCC_RETURN_IF_ERROR(
      CheckTargetRange("CrossEntropyForward", logits, targets, ignore_index));
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0) return absl::OkStatus();
  nn::DispatchFloat(logits.dtype(), [&](auto tl) {
    using T = decltype(tl);
    DispatchTargets(targets.dtype(), [&](auto tt) {
      using TT = decltype(tt);
      ForwardCpu(logits.data<T>(), targets.data<TT>(), rows, vocab,
                 ignore_index, loss->data<float>(), lse->data<float>());
    });
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, const Tensor& dloss,
                                  Tensor* dlogits, int64_t ignore_index) {
  ScopedOpTimer op_timer("CrossEntropyBackward");
  constexpr absl::string_view op = "CrossEntropyBackward";
  MCC_RETURN_IF_ERROR(CheckLogitsAndTargetShapes(op, logits, targets));
  MCC_RETURN_IF_ERROR(CheckPerToken(op, "lse", &lse, logits));
  MCC_RETURN_IF_ERROR(CheckPerToken(op, "dloss", &dloss, logits));
  MCC_RETURN_IF_ERROR(nn::Defined(op, "dlogits", dlogits));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, "dlogits", *dlogits));
  MCC_RETURN_IF_ERROR(nn::SameShape(op, "logits", logits, "dlogits", *dlogits));
  MCC_RETURN_IF_ERROR(
      nn::SameDevice(op, "logits", logits, "dlogits", *dlogits));
  if (logits.SharesStorageWith(*dlogits) &&
      (logits.raw_data() != dlogits->raw_data() ||
       logits.dtype() != dlogits->dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dlogits ", dlogits->Describe(), " overlaps logits ",
                     logits.Describe(), " without being the same tensor"));
  }
  return CrossEntropyBackwardKernels()(logits.device(), logits, targets, lse,
                                       dloss, dlogits, ignore_index);
}

namespace {

absl::Status CrossEntropyBackwardCpu(const Tensor& logits,
                                     const Tensor& targets, const Tensor& lse,
                                     const Tensor& dloss, Tensor* dlogits,
                                     int64_t ignore_index) {
  MCC_RETURN_IF_ERROR(
      CheckTargetRange("CrossEntropyBackward", logits, targets, ignore_index));
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0 || vocab == 0) return absl::OkStatus();
  nn::DispatchFloat(logits.dtype(), [&](auto tl) {
    using T = decltype(tl);
    nn::DispatchFloat(dlogits->dtype(), [&](auto to) {
      using TO = decltype(to);
      DispatchTargets(targets.dtype(), [&](auto tt) {
        using TT = decltype(tt);
        BackwardCpu(logits.data<T>(), targets.data<TT>(), lse.data<float>(),
                    dloss.data<float>(), rows, vocab, ignore_index,
                    dlogits->data<TO>());
      });
    });
  });
  return absl::OkStatus();
}

// ---- Vocabulary shards ------------------------------------------------------

// Sum of exp(x[c] - mx) over c < valid, accumulated in float64.
template <typename T>
double ShardSumExp(const T* x, int64_t valid, float mx) {
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  int64_t c = 0;
  for (; c + 8 <= valid; c += 8) {
    const __m256 e = nn::Exp8(_mm256_sub_ps(Load8(x + c), vmx));
    acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(acc0, acc1));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; c < valid; ++c) sum += nn::ExpS(LoadS(x + c) - mx);
  return sum;
}

// A CPU shard's first `valid` columns are real: 0 <= valid <= local.
absl::Status CheckValidColumns(absl::string_view op, const Tensor& logits,
                               int64_t valid) {
  if (valid < 0 || valid > logits.size(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", valid, " valid columns for logits ",
                     logits.Describe(), " (must be 0..", logits.size(1), ")"));
  }
  return absl::OkStatus();
}

// An fp32 tensor of the given shape on ref's device.
absl::Status CheckFloatShape(absl::string_view op, const char* name,
                             const Tensor* t, const Shape& shape,
                             const char* ref_name, const Tensor& ref) {
  MCC_RETURN_IF_ERROR(nn::Defined(op, name, t));
  MCC_RETURN_IF_ERROR(nn::IsF32(op, name, *t));
  if (t->shape() != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " ", t->Describe(), " must be ", ShapeToString(shape)));
  }
  return nn::SameDevice(op, ref_name, ref, name, *t);
}

// A shard's logits and targets, and the reduced statistics of its rows.
absl::Status CheckShardAndStats(absl::string_view op, const Tensor& logits,
                                const Tensor& targets, int64_t valid,
                                const Tensor& row_max, const Tensor* sums) {
  MCC_RETURN_IF_ERROR(CheckLogitsAndTargetShapes(op, logits, targets));
  MCC_RETURN_IF_ERROR(CheckValidColumns(op, logits, valid));
  const int64_t rows = logits.size(0);
  MCC_RETURN_IF_ERROR(
      CheckFloatShape(op, "row_max", &row_max, {rows}, "logits", logits));
  return CheckFloatShape(op, "sums", sums, {2, rows}, "logits", logits);
}

}  // namespace

absl::Status ShardedCrossEntropyRowMax(const Tensor& logits, int64_t valid,
                                       Tensor* row_max) {
  ScopedOpTimer op_timer("ShardedCrossEntropyRowMax");
  constexpr absl::string_view op = "ShardedCrossEntropyRowMax";
  MCC_RETURN_IF_ERROR(CheckLogits(op, logits));
  MCC_RETURN_IF_ERROR(CheckValidColumns(op, logits, valid));
  MCC_RETURN_IF_ERROR(CheckFloatShape(op, "row_max", row_max, {logits.size(0)},
                                      "logits", logits));
  return ShardedCrossEntropyRowMaxKernels()(logits.device(), logits, valid,
                                            row_max);
}

namespace {

absl::Status ShardedCrossEntropyRowMaxCpu(const Tensor& logits, int64_t valid,
                                          Tensor* row_max) {
  const int64_t rows = logits.size(0), local = logits.size(1);
  float* out = row_max->data<float>();
  nn::DispatchFloat(logits.dtype(), [&](auto tl) {
    using T = decltype(tl);
    const T* x = logits.data<T>();
    ThreadPool::Global().ParallelFor(rows, RowGrain(local),
                                     [&](int64_t r0, int64_t r1) {
                                       for (int64_t r = r0; r < r1; ++r)
                                         out[r] = RowMax(x + r * local, valid);
                                     });
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardedCrossEntropySums(const Tensor& logits,
                                     const Tensor& targets,
                                     const Tensor& row_max, int64_t vocab_start,
                                     int64_t valid, Tensor* sums) {
  ScopedOpTimer op_timer("ShardedCrossEntropySums");
  constexpr absl::string_view op = "ShardedCrossEntropySums";
  MCC_RETURN_IF_ERROR(
      CheckShardAndStats(op, logits, targets, valid, row_max, sums));
  return ShardedCrossEntropySumsKernels()(logits.device(), logits, targets,
                                          row_max, vocab_start, valid, sums);
}

namespace {

absl::Status ShardedCrossEntropySumsCpu(const Tensor& logits,
                                        const Tensor& targets,
                                        const Tensor& row_max,
                                        int64_t vocab_start, int64_t valid,
                                        Tensor* sums) {
  const int64_t rows = logits.size(0), local = logits.size(1);
  const float* mx = row_max.data<float>();
  float* sum_exp = sums->data<float>();
  float* target_term = sum_exp + rows;
  nn::DispatchFloat(logits.dtype(), [&](auto tl) {
    using T = decltype(tl);
    DispatchTargets(targets.dtype(), [&](auto tt) {
      using TT = decltype(tt);
      const T* x = logits.data<T>();
      const TT* y = targets.data<TT>();
      ThreadPool::Global().ParallelFor(
          rows, RowGrain(local), [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
              const T* row = x + r * local;
              const int64_t c = static_cast<int64_t>(y[r]) - vocab_start;
              target_term[r] =
                  c >= 0 && c < valid ? LoadS(row + c) - mx[r] : 0.0f;
              sum_exp[r] = static_cast<float>(ShardSumExp(row, valid, mx[r]));
            }
          });
    });
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardedCrossEntropyLoss(const Tensor& sums, const Tensor& targets,
                                     int64_t ignore_index, Tensor* loss) {
  ScopedOpTimer op_timer("ShardedCrossEntropyLoss");
  constexpr absl::string_view op = "ShardedCrossEntropyLoss";
  MCC_RETURN_IF_ERROR(nn::Defined(op, "targets", &targets));
  const int64_t rows = targets.numel();
  MCC_RETURN_IF_ERROR(
      CheckFloatShape(op, "sums", &sums, {2, rows}, "targets", targets));
  MCC_RETURN_IF_ERROR(
      CheckFloatShape(op, "loss", loss, {rows}, "targets", targets));
  if ((targets.dtype() != DType::kInt32 && targets.dtype() != DType::kInt64) ||
      targets.dim() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": targets ", targets.Describe(),
                     " must be int32 or int64 [", rows, "]"));
  }
  return ShardedCrossEntropyLossKernels()(targets.device(), sums, targets,
                                          ignore_index, loss);
}

namespace {

absl::Status ShardedCrossEntropyLossCpu(const Tensor& sums,
                                        const Tensor& targets,
                                        int64_t ignore_index, Tensor* loss) {
  const int64_t rows = targets.numel();
  const float* s = sums.data<float>();
  float* lp = loss->data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    lp[r] = TargetAt(targets, r) == ignore_index ? 0.0f
                                                 : std::log(s[r]) - s[rows + r];
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardedCrossEntropyBackward(
    const Tensor& logits, const Tensor& targets, const Tensor& row_max,
    const Tensor& sums, const Tensor& dloss, int64_t vocab_start, int64_t valid,
    int64_t ignore_index, Tensor* dlogits) {
  ScopedOpTimer op_timer("ShardedCrossEntropyBackward");
  constexpr absl::string_view op = "ShardedCrossEntropyBackward";
  MCC_RETURN_IF_ERROR(
      CheckShardAndStats(op, logits, targets, valid, row_max, &sums));
  MCC_RETURN_IF_ERROR(
      CheckFloatShape(op, "dloss", &dloss, {logits.size(0)}, "logits", logits));
  MCC_RETURN_IF_ERROR(nn::Defined(op, "dlogits", dlogits));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, "dlogits", *dlogits));
  MCC_RETURN_IF_ERROR(nn::SameShape(op, "logits", logits, "dlogits", *dlogits));
  MCC_RETURN_IF_ERROR(
      nn::SameDevice(op, "logits", logits, "dlogits", *dlogits));
  if (logits.SharesStorageWith(*dlogits)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": dlogits ", dlogits->Describe(),
                     " shares storage with logits ", logits.Describe()));
  }
  return ShardedCrossEntropyBackwardKernels()(logits.device(), logits, targets,
                                              row_max, sums, dloss, vocab_start,
                                              valid, ignore_index, dlogits);
}

namespace {

// The backward's softmax gradient drow[c] = exp(row[c] - mx) * inv * g for
// c below the largest multiple of 16 within valid, in 512-bit vectors: the
// 8-wide loop's operations lane for lane (Exp16 is Exp8 on 16 lanes), so
// every element equals it bit for bit. Returns the count done.
template <typename T, typename TO>
MCC_AVX512_TARGET int64_t SoftmaxGradRow16(const T* row, TO* drow,
                                           int64_t valid, float mx, float inv,
                                           float g) {
  const __m512 vm = _mm512_set1_ps(mx);
  const __m512 vi = _mm512_set1_ps(inv);
  const __m512 vg = _mm512_set1_ps(g);
  int64_t c = 0;
  for (; c + 16 <= valid; c += 16) {
    const __m512 p =
        _mm512_mul_ps(Exp16(_mm512_sub_ps(Load16F32(row + c), vm)), vi);
    Store16F32(drow + c, _mm512_mul_ps(p, vg));
  }
  return c;
}

absl::Status ShardedCrossEntropyBackwardCpu(
    const Tensor& logits, const Tensor& targets, const Tensor& row_max,
    const Tensor& sums, const Tensor& dloss, int64_t vocab_start, int64_t valid,
    int64_t ignore_index, Tensor* dlogits) {
  const int64_t rows = logits.size(0), local = logits.size(1);
  const float* mx = row_max.data<float>();
  const float* sum_exp = sums.data<float>();
  const float* gp = dloss.data<float>();
  nn::DispatchFloat(logits.dtype(), [&](auto tl) {
    using T = decltype(tl);
    nn::DispatchFloat(dlogits->dtype(), [&](auto to) {
      using TO = decltype(to);
      DispatchTargets(targets.dtype(), [&](auto tt) {
        using TT = decltype(tt);
        const T* x = logits.data<T>();
        const TT* y = targets.data<TT>();
        TO* dx = dlogits->data<TO>();
        const bool avx512 = KernelIsa() == CpuIsa::kAvx512;
        ThreadPool::Global().ParallelFor(
            rows, RowGrain(local), [&](int64_t r0, int64_t r1) {
              for (int64_t r = r0; r < r1; ++r) {
                const T* row = x + r * local;
                TO* drow = dx + r * local;
                const int64_t target = static_cast<int64_t>(y[r]);
                int64_t c = 0;
                if (target != ignore_index) {
                  // softmax = exp(x - max) * (1 / sum), rounded to fp32,
                  // then times dloss.
                  const float inv = 1.0f / sum_exp[r];
                  const float g = gp[r];
                  const __m256 vm = _mm256_set1_ps(mx[r]);
                  const __m256 vi = _mm256_set1_ps(inv);
                  const __m256 vg = _mm256_set1_ps(g);
                  if (avx512) {
                    c = SoftmaxGradRow16(row, drow, valid, mx[r], inv, g);
                  }
                  // 16 at a time in the 16-bit lane order (bf16 logits and
                  // gradients skip the widening shifts and cross-lane
                  // shuffles); each lane's arithmetic is the 8-wide loop's.
                  constexpr Lanes16 L = kLanes16For<T, TO>;
                  for (; c + 16 <= valid; c += 16) {
                    __m256 lo, hi;
                    Load16<L>(row + c, &lo, &hi);
                    const __m256 plo =
                        _mm256_mul_ps(nn::Exp8(_mm256_sub_ps(lo, vm)), vi);
                    const __m256 phi =
                        _mm256_mul_ps(nn::Exp8(_mm256_sub_ps(hi, vm)), vi);
                    Store16<L>(drow + c, _mm256_mul_ps(plo, vg),
                               _mm256_mul_ps(phi, vg));
                  }
                  for (; c + 8 <= valid; c += 8) {
                    const __m256 p = _mm256_mul_ps(
                        nn::Exp8(_mm256_sub_ps(Load8(row + c), vm)), vi);
                    nn::Store8(drow + c, _mm256_mul_ps(p, vg));
                  }
                  for (; c < valid; ++c) {
                    const float p = nn::ExpS(LoadS(row + c) - mx[r]) * inv;
                    nn::StoreS(drow + c, p * g);
                  }
                  const int64_t t = target - vocab_start;
                  if (t >= 0 && t < valid) {
                    const float p = nn::ExpS(LoadS(row + t) - mx[r]) * inv;
                    nn::StoreS(drow + t, p * g - g);
                  }
                }
                for (; c < local; ++c) nn::StoreS(drow + c, 0.0f);
              }
            });
      });
    });
  });
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MeanLoss> CrossEntropyMeanLoss(const Tensor& loss,
                                              const Tensor& targets,
                                              int64_t ignore_index) {
  constexpr absl::string_view op = "CrossEntropyMeanLoss";
  MCC_RETURN_IF_ERROR(nn::Defined(op, "loss", &loss));
  MCC_RETURN_IF_ERROR(nn::Defined(op, "targets", &targets));
  MCC_RETURN_IF_ERROR(nn::IsF32(op, "loss", loss));
  if (targets.dtype() != DType::kInt32 && targets.dtype() != DType::kInt64) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": targets must be int32 or int64, got ", targets.Describe()));
  }
  if (loss.dim() != 1 || targets.shape() != loss.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": loss ", loss.Describe(), " and targets ",
                     targets.Describe(), " must both be [tokens]"));
  }
  MCC_RETURN_IF_ERROR(nn::SameDevice(op, "loss", loss, "targets", targets));
  return CrossEntropyMeanLossKernels()(loss.device(), loss, targets,
                                       ignore_index);
}

namespace {

absl::StatusOr<MeanLoss> CrossEntropyMeanLossCpu(const Tensor& loss,
                                                 const Tensor& targets,
                                                 int64_t ignore_index) {
  MeanLoss m;
  const float* l = loss.data<float>();
  for (int64_t i = 0; i < loss.numel(); ++i) {
    if (TargetAt(targets, i) == ignore_index) continue;
    m.sum += l[i];
    ++m.count;
  }
  m.mean = m.count > 0 ? m.sum / m.count : 0.0;
  return m;
}

}  // namespace

#define MCC_CE_SLOT(Type, Name, op, cpu) MCC_KERNEL_SLOT(Type, Name, op, cpu);
MCC_CE_SLOT(CrossEntropyForwardKernel, CrossEntropyForwardKernels,
            "CrossEntropyForward", &CrossEntropyForwardCpu)
MCC_CE_SLOT(CrossEntropyBackwardKernel, CrossEntropyBackwardKernels,
            "CrossEntropyBackward", &CrossEntropyBackwardCpu)
MCC_CE_SLOT(CrossEntropyMeanLossKernel, CrossEntropyMeanLossKernels,
            "CrossEntropyMeanLoss", &CrossEntropyMeanLossCpu)
MCC_CE_SLOT(ShardedCrossEntropyRowMaxKernel, ShardedCrossEntropyRowMaxKernels,
            "ShardedCrossEntropyRowMax", &ShardedCrossEntropyRowMaxCpu)
MCC_CE_SLOT(ShardedCrossEntropySumsKernel, ShardedCrossEntropySumsKernels,
            "ShardedCrossEntropySums", &ShardedCrossEntropySumsCpu)
MCC_CE_SLOT(ShardedCrossEntropyLossKernel, ShardedCrossEntropyLossKernels,
            "ShardedCrossEntropyLoss", &ShardedCrossEntropyLossCpu)
MCC_CE_SLOT(ShardedCrossEntropyBackwardKernel,
            ShardedCrossEntropyBackwardKernels, "ShardedCrossEntropyBackward",
            &ShardedCrossEntropyBackwardCpu)
#undef MCC_CE_SLOT

}  // namespace ops
}  // namespace mcc
