#include "core/ops/reduce.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

// Elements per partial sum (fixed, so the result ignores the thread count).
constexpr int64_t kPartial = 64 * 1024;

// Sum (or sum of squares) of n fp32 values, in 8 float64 lanes.
template <bool kSquare>
double SumF32(const float* x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      const double v = x[i + j];
      acc[j] += kSquare ? v * v : v;
    }
  }
  for (; i < n; ++i) {
    const double v = x[i];
    acc[0] += kSquare ? v * v : v;
  }
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) +
         ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

template <bool kSquare>
absl::StatusOr<double> Reduce(const char* op, const Tensor& x) {
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"x", &x}));
  if (!x.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(ReduceKernel k, ReduceKernels().Get(x.device()));
    return k(x, kSquare);
  }
  const int64_t n = x.numel();
  const int64_t parts = (n + kPartial - 1) / kPartial;
  std::vector<double> partial(parts, 0.0);
  DispatchFloat(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* p = x.data<T>();
    ThreadPool::Global().ParallelFor(parts, 1, [&](int64_t b, int64_t e) {
      float buf[kBlock];
      for (int64_t q = b; q < e; ++q) {
        const int64_t end = std::min(n, (q + 1) * kPartial);
        double s = 0;
        for (int64_t i = q * kPartial; i < end; i += kBlock) {
          const int64_t m = std::min(kBlock, end - i);
          s += SumF32<kSquare>(AsF32(p + i, m, buf), m);
        }
        partial[q] = s;
      }
    });
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

KernelSlot<ReduceKernel>& ReduceKernels() {
  static auto* slot = new KernelSlot<ReduceKernel>("Sum/SumOfSquares");
  return *slot;
}

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
