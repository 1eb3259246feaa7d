#ifndef CORE_OPS_TEST_UTIL_H_
#define CORE_OPS_TEST_UTIL_H_

// Helpers for the kernel tests: random tensors, float64 comparisons, central
// finite differences, a fake "CUDA" device backed by host memory so the
// tests can check that ops refuse (or dispatch) non-CPU tensors, and
// ExpectSameOnTestDevice, which runs an op on the test device
// (core/testing/test_device.h) and checks it agrees with the CPU bit for bit.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/allocator.h"
#include "core/tensor.h"
#include "core/testing/test_device.h"
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

// Runs `op` on its arguments twice: on deep CPU copies of `args` and on
// test-device copies, and expects the same status and, for every argument
// (inputs too: ops may write in place or accumulate), the same bytes. args
// are CPU tensors holding the inputs and the outputs' initial values
// (undefined tensors stay undefined, for optional arguments). Also expects
// the device run to make no copy between the device and the host: an op
// reaches device memory only through its kernel. Returns the CPU run's
// tensors, for checks against a reference.
//   ExpectSameOnTestDevice({x, y}, [](std::vector<Tensor>& t) {
//     return Gelu(t[0], &t[1]);
//   });
using TensorOp = std::function<absl::Status(std::vector<Tensor>& args)>;
inline std::vector<Tensor> ExpectSameOnTestDevice(
    const std::vector<Tensor>& args, const TensorOp& op,
    const std::string& what = "") {
  std::vector<Tensor> cpu, dev;
  for (const Tensor& t : args) {
    cpu.push_back(t.defined() ? t.Clone() : Tensor());
    dev.push_back(t.defined() ? *t.To(Device::TestDevice()) : Tensor());
  }
  const absl::Status cpu_status = op(cpu);
  const int64_t to_host = mcc::testing::TestDeviceCopiesToHost();
  const int64_t from_host = mcc::testing::TestDeviceCopiesFromHost();
  const absl::Status dev_status = op(dev);
  EXPECT_EQ(mcc::testing::TestDeviceCopiesToHost(), to_host)
      << what << ": the op copied device memory to the host";
  EXPECT_EQ(mcc::testing::TestDeviceCopiesFromHost(), from_host)
      << what << ": the op copied host memory to the device";
  EXPECT_EQ(cpu_status, dev_status) << what;
  for (size_t i = 0; i < args.size(); ++i) {
    if (!cpu[i].defined()) continue;
    EXPECT_EQ(dev[i].device(), Device::TestDevice()) << what << " arg " << i;
    const Tensor back = *dev[i].To(Device::CPU());
    EXPECT_EQ(back.shape(), cpu[i].shape()) << what << " arg " << i;
    EXPECT_EQ(back.dtype(), cpu[i].dtype()) << what << " arg " << i;
    if (back.nbytes() != cpu[i].nbytes()) continue;
    const bool same =
        std::memcmp(back.raw_data(), cpu[i].raw_data(), back.nbytes()) == 0;
    EXPECT_TRUE(same) << what << ": argument " << i << " (" << cpu[i].Describe()
                      << ") differs between the CPU and the test device";
  }
  return cpu;
}

}  // namespace testing
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_TEST_UTIL_H_
