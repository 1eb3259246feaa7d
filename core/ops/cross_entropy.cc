#include "core/ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
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

// logits 2-D float, targets [tokens] int32/int64 with every target valid.
absl::Status CheckLogitsTargets(absl::string_view op, const Tensor& logits,
                                const Tensor& targets, int64_t ignore_index) {
  MCC_RETURN_IF_ERROR(nn::Defined(op, "logits", &logits));
  MCC_RETURN_IF_ERROR(nn::Defined(op, "targets", &targets));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, "logits", logits));
  if (logits.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": logits must be [tokens, vocab], got ", logits.Describe()));
  }
  if (targets.dtype() != DType::kInt32 && targets.dtype() != DType::kInt64) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": targets must be int32 or int64, got ", targets.Describe()));
  }
  if (targets.dim() != 1 || targets.size(0) != logits.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": targets ", targets.Describe(),
                     " must be [tokens] for logits ", logits.Describe()));
  }
  MCC_RETURN_IF_ERROR(nn::SameDevice(op, "logits", logits, "targets", targets));
  if (!targets.device().is_cpu()) return absl::OkStatus();  // Checked there.
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

template <typename T>
float RowLogSumExp(const T* x, int64_t n) {
  __m256 vm = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) vm = _mm256_max_ps(vm, Load8(x + c));
  float mx = nn::HMax(vm);
  for (; c < n; ++c) mx = std::max(mx, LoadS(x + c));
  if (std::isinf(mx)) return mx;  // All -inf (or an inf): nothing to sum.
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  c = 0;
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
  MCC_RETURN_IF_ERROR(CheckLogitsTargets(op, logits, targets, ignore_index));
  MCC_RETURN_IF_ERROR(CheckPerToken(op, "loss", loss, logits));
  MCC_RETURN_IF_ERROR(CheckPerToken(op, "lse", lse, logits));
  MCC_RETURN_IF_ERROR(nn::CpuOnly(op, logits));
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  if (rows == 0) return absl::OkStatus();
  if (vocab == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": empty vocabulary in logits ", logits.Describe()));
  }
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

absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets,
                                  const Tensor& lse, const Tensor& dloss,
                                  Tensor* dlogits, int64_t ignore_index) {
  ScopedOpTimer op_timer("CrossEntropyBackward");
  constexpr absl::string_view op = "CrossEntropyBackward";
  MCC_RETURN_IF_ERROR(CheckLogitsTargets(op, logits, targets, ignore_index));
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
  MCC_RETURN_IF_ERROR(nn::CpuOnly(op, logits));
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
  MCC_RETURN_IF_ERROR(nn::CpuOnly(op, loss));
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

}  // namespace ops
}  // namespace mcc
