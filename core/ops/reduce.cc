#include "core/ops/reduce.h"

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

// Elements per partial sum (fixed, so the result ignores the thread count).
constexpr int64_t kPartial = 64 * 1024;

// Sum (or sum of squares) of n values as fp32, in 8 float64 lanes; 16-bit
// inputs are widened in registers.
template <bool kSquare, typename T>
double SumF32(const T* x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
#if defined(__AVX2__)
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = Load8(x + i);
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    if (kSquare) {
      a0 = _mm256_fmadd_pd(lo, lo, a0);
      a1 = _mm256_fmadd_pd(hi, hi, a1);
    } else {
      a0 = _mm256_add_pd(a0, lo);
      a1 = _mm256_add_pd(a1, hi);
    }
  }
  _mm256_storeu_pd(acc, a0);
  _mm256_storeu_pd(acc + 4, a1);
#endif
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double v = ToF32(x[i + j]);
      acc[j] += kSquare ? v * v : v;
    }
  }
  for (; i < n; ++i) {
    const double v = ToF32(x[i]);
    acc[0] += kSquare ? v * v : v;
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
         ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

template <bool kSquare>
double ReduceCpuTyped(const Tensor& x) {
  const int64_t n = x.numel();
  const int64_t parts = (n + kPartial - 1) / kPartial;
  std::vector<double> partial(parts, 0.0);
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    ThreadPool::Global().ParallelFor(parts, 1, [&](int64_t b, int64_t e) {
      for (int64_t q = b; q < e; ++q) {
        const int64_t end = std::min(n, (q + 1) * kPartial);
        double s = 0;
        for (int64_t i = q * kPartial; i < end; i += kBlock) {
          const int64_t m = std::min(kBlock, end - i);
          s += SumF32<kSquare>(p + i, m);
        }
        partial[q] = s;
      }
    });
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

absl::StatusOr<double> ReduceCpu(const Tensor& x, bool square) {
  return square ? ReduceCpuTyped<true>(x) : ReduceCpuTyped<false>(x);
}

template <bool kSquare>
absl::StatusOr<double> Reduce(const char* op, const Tensor& x) {
  ScopedOpTimer op_timer(op);
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"x", &x}));
  return ReduceKernels()(x.device(), x, kSquare);
}

}  // namespace

namespace internal {
double SumOfSquaresCpu(const Tensor& x) { return ReduceCpuTyped<true>(x); }
}  // namespace internal

MCC_KERNEL_SLOT(ReduceKernel, ReduceKernels, "Sum/SumOfSquares", &ReduceCpu);

absl::StatusOr<double> Sum(const Tensor& x) { return Reduce<false>("Sum", x); }

absl::StatusOr<double> SumOfSquares(const Tensor& x) {
  return Reduce<true>("SumOfSquares", x);
}

absl::StatusOr<double> L2Norm(const Tensor& x) {
  MCC_ASSIGN_OR_RETURN(const double s, Reduce<true>("L2Norm", x));
  return std::sqrt(s);
}

}  // namespace ops
}  // namespace mcc
