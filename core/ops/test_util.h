#ifndef CORE_OPS_TEST_UTIL_H_
#define CORE_OPS_TEST_UTIL_H_

// Helpers for the kernel tests: random tensors, float64 comparisons, central
// finite differences, and a fake "CUDA" device backed by host memory so the
// tests can check that ops refuse (or dispatch) non-CPU tensors.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace testing {

// Uniform values in [lo, hi), converted to dtype.
inline Tensor RandomTensor(const Shape& shape, DType dtype, uint32_t seed,
                           float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(NumElements(shape));
  for (float& x : v) x = dist(gen);
  return Tensor::FromVector(v, shape, dtype).value();
}

// Raw bytes, to check that a failed op left its output untouched.
inline std::vector<uint8_t> Bytes(const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  std::memcpy(b.data(), t.raw_data(), b.size());
  return b;
}

// |got - want| <= atol + rtol * |want| elementwise, reporting the first few
// failures with their index.
inline void ExpectAllNear(const std::vector<double>& got,
                          const std::vector<double>& want, double atol,
                          double rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = atol + rtol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[i]
                    << " want " << want[i] << " (tol " << tol << ")";
      if (++failures >= 5) return;
    }
  }
}

// Central finite differences of a scalar float64 function at x.
inline std::vector<double> NumericGrad(
    const std::function<double(const std::vector<double>&)>& f,
    std::vector<double> x, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double fp = f(x);
    x[i] = x0 - h;
    const double fm = f(x);
    x[i] = x0;
    g[i] = (fp - fm) / (2 * h);
  }
  return g;
}

inline double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// A "CUDA" allocator handing out host memory: ops must treat such tensors as
// CUDA tensors (no CPU kernel may touch them).
class FakeCudaAllocator : public Allocator {
 public:
  explicit FakeCudaAllocator(int index) : index_(index) {}
  Device device() const override { return Device::CUDA(index_); }

 protected:
  void* RawAllocate(size_t bytes) override {
    return std::aligned_alloc(kCpuAlignment, (bytes + kCpuAlignment - 1) /
                                                 kCpuAlignment * kCpuAlignment);
  }
  void RawFree(void* ptr, size_t) override { std::free(ptr); }

 private:
  int index_;
};

inline Tensor FakeCudaTensor(const Shape& shape, DType dtype) {
  static bool registered = [] {
    RegisterAllocator(DeviceType::kCUDA, [](int index) -> Allocator* {
      return new FakeCudaAllocator(index);
    });
    return true;
  }();
  (void)registered;
  return Tensor::Empty(shape, dtype, Device::CUDA(0));
}

}  // namespace testing
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_TEST_UTIL_H_
