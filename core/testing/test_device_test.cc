#include "core/testing/test_device.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace testing {
namespace {

TEST(TestDeviceTest, TensorsCarryAddressesTheHostCannotUse) {
  Tensor t = Tensor::Empty({4, 8}, DType::kFloat32, Device::TestDevice());
  EXPECT_EQ(t.device().ToString(), "testdev:0");
  const uintptr_t address = reinterpret_cast<uintptr_t>(t.raw_data());
  // Bits 63..47 of a usable x86-64 address are all equal; these are not.
  EXPECT_NE((address >> 62) & 1, (address >> 63) & 1);
  EXPECT_TRUE(IsHostBacked(DeviceType::kTestDevice));
  EXPECT_FALSE(IsHostBacked(DeviceType::kCPU));
}

TEST(TestDeviceDeathTest, TypedHostAccessDiesNamingTheTensor) {
  Tensor t = Tensor::Empty({3}, DType::kFloat32, Device::TestDevice());
  EXPECT_DEATH(t.data<float>()[0] = 1.0f,
               "host code dereferenced fp32\\[3\\] on testdev:0");
}

TEST(TestDeviceDeathTest, RawHostAccessFaults) {
  Tensor t = Tensor::Empty({3}, DType::kFloat32, Device::TestDevice());
  EXPECT_DEATH(
      {
        volatile float* p = static_cast<float*>(t.raw_data());
        p[0] = 1.0f;
      },
      "");
}

TEST(TestDeviceTest, CopiesRoundTripAndAreCounted) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f};
  Tensor host = *Tensor::FromVector(values, {2, 2});
  const int64_t from_host = TestDeviceCopiesFromHost();
  const int64_t to_host = TestDeviceCopiesToHost();
  Tensor dev = *host.To(Device::TestDevice());
  Tensor dev2 = dev.Clone();  // Device to device.
  Tensor back = *dev2.To(Device::CPU());
  EXPECT_EQ(back.ToFloats(), values);
  EXPECT_EQ(TestDeviceCopiesFromHost(), from_host + 1);
  EXPECT_EQ(TestDeviceCopiesToHost(), to_host + 1);
  // Views and conversions stay on the device.
  Tensor row = *dev.Slice(1, 2);
  EXPECT_EQ(row.ToFloats(), (std::vector<float>{3.25f, 0.0f}));
  Tensor half = *dev.To(DType::kBFloat16);
  EXPECT_EQ(half.device(), Device::TestDevice());
  EXPECT_EQ(half.ToFloats(), values);
}

TEST(TestDeviceTest, FillAndZeroWorkOnTheDevice) {
  Tensor t = Tensor::Full({5}, 2.5, DType::kFloat16, Device::TestDevice());
  EXPECT_EQ(t.ToFloats(), std::vector<float>(5, 2.5f));
  t.Zero();
  EXPECT_EQ(t.ToFloats(), std::vector<float>(5, 0.0f));
}

// A kernel that reads and writes through typed pointers: it can only run on
// host views.
absl::Status AddOneCpu(const Tensor& x, Tensor* y) {
  const float* xp = x.data<float>();
  float* yp = y->data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) yp[i] = xp[i] + 1.0f;
  return absl::OkStatus();
}

using AddOneKernel = absl::Status (*)(const Tensor&, Tensor*);

TEST(TestDeviceTest, SlotsRunTheCpuKernelOnHostViews) {
  ops::KernelSlot<AddOneKernel> slot("AddOne", &AddOneCpu);
  Tensor x = *(*Tensor::FromVector({1, 2, 3}, {3})).To(Device::TestDevice());
  Tensor y = Tensor::Empty({3}, DType::kFloat32, Device::TestDevice());
  ASSERT_TRUE(slot(y.device(), x, &y).ok());
  EXPECT_EQ(y.ToFloats(), (std::vector<float>{2, 3, 4}));
  EXPECT_EQ(y.device(), Device::TestDevice());
}

TEST(TestDeviceTest, SlotsWithoutAKernelNameTheOpAndDevice) {
  ops::KernelSlot<AddOneKernel> slot("AddOne");
  Tensor x = Tensor::Zeros({3}, DType::kFloat32, Device::TestDevice());
  Tensor y = Tensor::Empty({3}, DType::kFloat32, Device::TestDevice());
  const absl::Status status = slot(y.device(), x, &y);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(status.message().find("AddOne"), std::string::npos);
  EXPECT_NE(status.message().find("testdev:0"), std::string::npos);
}

}  // namespace
}  // namespace testing
}  // namespace mcc
