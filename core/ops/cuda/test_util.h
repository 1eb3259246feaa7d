// Helpers for the CUDA kernel tests: a fixture that skips without a device,
// random CPU inputs, copies to and from the device, and comparisons against
// a per-element error bound.
#ifndef CORE_OPS_CUDA_TEST_UTIL_H_
#define CORE_OPS_CUDA_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/cuda/runtime.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace testing {

// Unit roundoff of fp32: every correctly rounded fp32 operation has a
// relative error of at most this.
inline constexpr double kU32 = 1.0 / (1 << 24);

// The spacing of a 16-bit float dtype relative to the value, at most (at the
// bottom of a binade): rounding one fp32 value, or two fp32 values that lie
// within a bound of each other, to it differs by at most one such step
// beyond that bound. 0 for fp32 (its rounding is in the arithmetic bounds).
inline double OutputUlp(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16:
      return 1.0 / 128;  // 8 significant bits
    case DType::kFloat16:
      return 1.0 / 1024;  // 11 significant bits
    default:
      return 0.0;
  }
}

// The device whose kernels the tests compare with the CPU's: cuda:0, or,
// in the *_on_test_device builds (MCC_KERNEL_TESTS_ON_TEST_DEVICE), the test
// device (core/testing/test_device.h), which runs the CPU kernels behind the
// same wall. There the comparisons hold trivially, but every line of the
// tests themselves (op calls, copies, bounds) runs in CI, so a GPU run is
// not their first.
inline Device KernelDevice() {
#ifdef MCC_KERNEL_TESTS_ON_TEST_DEVICE
  return Device::TestDevice(0);
#else
  return Device::CUDA(0);
#endif
}

inline bool OnTestDevice() { return KernelDevice().type != DeviceType::kCUDA; }

// Skips every test of a suite on a machine without a CUDA device, saying so
// (never on the test device).
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!OnTestDevice() && ::mcc::cuda::CudaDeviceCount() == 0) {
      GTEST_SKIP() << "no CUDA device (" << ::mcc::cuda::NoCudaDeviceReason()
                   << "): the CUDA kernels are checked on a GPU machine "
                      "(tools/gpu/run_checks.sh)";
    }
  }
};

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

inline Tensor ToCuda(const Tensor& host) { return *host.To(KernelDevice()); }
inline Tensor ToHost(const Tensor& t) { return *t.To(Device::CPU()); }

// Values of a tensor on any device, as float64.
inline std::vector<double> Values(const Tensor& t) {
  return t.device().is_cpu() ? t.ToDoubles() : ToHost(t).ToDoubles();
}

// Every |got[i] - want[i]| <= bound[i] (NaN fails unless both are NaN);
// reports the count out of bound and the worst element.
inline ::testing::AssertionResult WithinBound(
    const std::vector<double>& got, const std::vector<double>& want,
    const std::vector<double>& bound) {
  if (got.size() != want.size() || bound.size() != want.size()) {
    return ::testing::AssertionFailure()
           << "sizes differ: got " << got.size() << ", want " << want.size()
           << ", bound " << bound.size();
  }
  int64_t bad = 0;
  size_t worst = 0;
  double worst_ratio = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    const double err = std::fabs(got[i] - want[i]);
    if (err <= bound[i]) continue;
    ++bad;
    const double ratio = std::isnan(err) ? INFINITY : err / bound[i];
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements out of bound; worst at "
         << worst << ": got " << got[worst] << ", want " << want[worst]
         << ", |diff| " << std::fabs(got[worst] - want[worst]) << " > bound "
         << bound[worst];
}

// The same bytes (bit-exact results, NaN payloads and signed zeros too).
inline ::testing::AssertionResult SameBytes(const Tensor& got,
                                            const Tensor& want) {
  const Tensor g = got.device().is_cpu() ? got : ToHost(got);
  const Tensor w = want.device().is_cpu() ? want : ToHost(want);
  if (g.dtype() != w.dtype() || g.numel() != w.numel()) {
    return ::testing::AssertionFailure()
           << g.Describe() << " vs " << w.Describe();
  }
  const auto* a = static_cast<const unsigned char*>(g.raw_data());
  const auto* b = static_cast<const unsigned char*>(w.raw_data());
  const size_t esize = DTypeSize(g.dtype());
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (std::memcmp(a + i * esize, b + i * esize, esize) != 0) {
      return ::testing::AssertionFailure()
             << "element " << i << " of " << g.Describe() << " differs: got "
             << g.ToDoubles()[i] << ", want " << w.ToDoubles()[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace testing
}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_TEST_UTIL_H_
