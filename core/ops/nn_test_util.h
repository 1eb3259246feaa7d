#ifndef CORE_OPS_NN_TEST_UTIL_H_
#define CORE_OPS_NN_TEST_UTIL_H_

// Helpers for the transformer-kernel tests: random tensors and element-wise
// comparison against float64 references (RandomTensor and
// ExpectSameOnTestDevice come from test_util.h).

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/ops/test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace testing {

inline std::vector<double> RandomDoubles(int64_t n, uint32_t seed,
                                         double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& d : v) d = dist(gen);
  return v;
}

// Every |got - want| <= atol + rtol * |want|; reports the first few misses.
inline void ExpectClose(const std::vector<double>& got,
                        const std::vector<double>& want, double atol,
                        double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  double worst = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const double tol = atol + rtol * std::fabs(want[i]);
    worst = std::max(worst, err - tol);
    if (!(err <= tol) && misses++ < 5) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[i]
                    << " want " << want[i] << " (|err| " << err << " > tol "
                    << tol << ")";
    }
  }
  if (misses > 5) ADD_FAILURE() << what << ": " << misses << " misses in all";
}

// Central finite differences of f (a scalar function of v) in every element.
template <typename F>
std::vector<double> NumericGrad(std::vector<double> v, F&& f,
                                double step = 1e-6) {
  std::vector<double> g(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + step;
    const double up = f(v);
    v[i] = keep - step;
    const double down = f(v);
    v[i] = keep;
    g[i] = (up - down) / (2.0 * step);
  }
  return g;
}

inline Tensor FromDoubles(const std::vector<double>& v, const Shape& shape,
                          DType dtype) {
  std::vector<float> f(v.begin(), v.end());
  return Tensor::FromVector(f, shape, dtype).value();
}

// Whether every element of t still holds value (outputs untouched on error).
inline bool AllEqual(const Tensor& t, double value) {
  for (double d : t.ToDoubles()) {
    if (d != value) return false;
  }
  return true;
}

}  // namespace testing
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_NN_TEST_UTIL_H_
