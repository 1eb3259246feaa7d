// Helpers for the CUDA op tests: random CPU inputs and float64 comparisons.
#ifndef CORE_OPS_CUDA_TEST_UTIL_H_
#define CORE_OPS_CUDA_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace testing {

inline std::vector<float> RandomFloats(int64_t n, uint32_t seed,
                                       float lo = -2.0f, float hi = 2.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// A random CPU tensor of dtype (values rounded to it).
inline Tensor RandomHost(const Shape& shape, DType dtype, uint32_t seed,
                         float lo = -2.0f, float hi = 2.0f) {
  return *Tensor::FromVector(RandomFloats(NumElements(shape), seed, lo, hi),
                             shape, dtype);
}

inline Tensor ToCuda(const Tensor& host) { return *host.To(Device::CUDA(0)); }

// Every |got - want| <= atol + rtol * |want|; reports the worst element.
inline ::testing::AssertionResult AllClose(const std::vector<double>& got,
                                           const std::vector<double>& want,
                                           double atol, double rtol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: " << got.size() << " vs " << want.size();
  }
  double worst = 0.0;
  size_t worst_i = 0;
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const double excess = err - (atol + rtol * std::fabs(want[i]));
    if (!(excess <= 0.0)) {  // NaN counts as bad
      ++bad;
      if (!(excess <= worst)) {
        worst = std::isnan(excess) ? INFINITY : excess;
        worst_i = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements out of tolerance (atol "
         << atol << ", rtol " << rtol << "); worst at " << worst_i << ": got "
         << got[worst_i] << ", want " << want[worst_i];
}

}  // namespace testing
}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_TEST_UTIL_H_
