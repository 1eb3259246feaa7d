// Activation offloading on the test device, with the synchronous stand-in
// and with deferred side streams (core/testing/deferred_side_stream.h),
// whose copies happen only when waited for: values come back bit for bit,
// the device memory goes when ReleaseOffloaded says, shared tensors travel
// once, and misuse is named.
#include "core/activation_offload.h"

#include <cstring>
#include <numeric>
#include <vector>

#include "core/allocator.h"
#include "core/side_stream.h"
#include "core/testing/deferred_side_stream.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

const Device kDev = Device::TestDevice();

Tensor DeviceTensor(Shape shape, float first) {
  std::vector<float> v(NumElements(shape));
  std::iota(v.begin(), v.end(), first);
  return *Tensor::FromVector(v, shape)->To(kDev);
}

bool SameBits(const Tensor& a, const Tensor& b) {
  const Tensor ha = *a.To(Device::CPU());
  const Tensor hb = *b.To(Device::CPU());
  return ha.shape() == hb.shape() && ha.dtype() == hb.dtype() &&
         std::memcmp(ha.raw_data(), hb.raw_data(), ha.nbytes()) == 0;
}

int64_t DeviceBytes() { return GetAllocator(kDev)->Stats().current_bytes; }

class ActivationOffloadTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) testing::InstallDeferredSideStreams();
  }
  void TearDown() override {
    if (GetParam()) testing::RemoveDeferredSideStreams();
  }
};

TEST_P(ActivationOffloadTest, RoundTripIsExactAndFreesTheDevice) {
  auto offloader = *ActivationOffloader::Create(kDev);
  EXPECT_EQ(offloader->asynchronous(), GetParam());
  // Sizes that are not multiples of anything in particular.
  Tensor a = DeviceTensor({7, 13}, 0.5f);
  Tensor b = DeviceTensor({5}, -3.0f);
  Tensor bf = *DeviceTensor({3, 11}, 1.25f).To(DType::kBFloat16);
  const Tensor want_a = a.Clone(), want_b = b.Clone(), want_bf = bf.Clone();
  Tensor same_as_a = a;  // The same tensor in two slots: one copy.
  Tensor undefined;
  std::vector<Tensor*> slots = {&a, &undefined, &b, &same_as_a, &bf};
  const int64_t before = DeviceBytes();
  auto group = offloader->Offload(slots);
  ASSERT_TRUE(group.ok()) << group.status();
  const int64_t moved = 7 * 13 * 4 + 5 * 4 + 3 * 11 * 2;
  EXPECT_EQ((*group)->bytes(), moved);
  for (Tensor* t : slots) EXPECT_FALSE(t->defined());
  // Held until the current stream is ordered after the copies.
  EXPECT_EQ(DeviceBytes(), before);
  ASSERT_TRUE(offloader->ReleaseOffloaded().ok());
  EXPECT_EQ(before - DeviceBytes(), moved);

  ASSERT_TRUE(offloader->Restore(group->get(), slots).ok());
  EXPECT_TRUE(SameBits(a, want_a));
  EXPECT_TRUE(SameBits(b, want_b));
  EXPECT_TRUE(SameBits(bf, want_bf));
  EXPECT_FALSE(undefined.defined());
  EXPECT_TRUE(same_as_a.SharesStorageWith(a));
  const OffloadStats s = offloader->stats();
  EXPECT_EQ(s.groups, 1);
  EXPECT_EQ(s.tensors, 3);
  EXPECT_EQ(s.bytes, moved);
  EXPECT_EQ(s.restored_bytes, moved);
  EXPECT_GE(s.pinned_bytes, moved);
}

TEST_P(ActivationOffloadTest, PrefetchOverlapsAndBuffersAreReused) {
  auto offloader = *ActivationOffloader::Create(kDev);
  // Three layers' records: offload in order, restore in reverse with the
  // next one prefetched, as the model does.
  std::vector<Tensor> layers, want;
  for (int i = 0; i < 3; ++i) {
    layers.push_back(DeviceTensor({9, 5}, 100.0f * i));
    want.push_back(layers.back().Clone());
  }
  std::vector<std::unique_ptr<ActivationOffloader::Group>> groups;
  for (int i = 0; i < 3; ++i) {
    auto g = offloader->Offload({&layers[i]});
    ASSERT_TRUE(g.ok()) << g.status();
    groups.push_back(std::move(*g));
  }
  ASSERT_TRUE(offloader->ReleaseOffloaded().ok());
  for (int i = 2; i >= 0; --i) {
    ASSERT_TRUE(offloader->Restore(groups[i].get(), {&layers[i]}).ok());
    if (i > 0) {
      ASSERT_TRUE(offloader->Prefetch(groups[i - 1].get()).ok());
    }
    EXPECT_TRUE(SameBits(layers[i], want[i])) << "layer " << i;
  }
  // A second round reuses the pinned buffers.
  const int64_t pinned = offloader->stats().pinned_bytes;
  auto g = offloader->Offload({&layers[0]});
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(offloader->Restore(g->get(), {&layers[0]}).ok());
  EXPECT_TRUE(SameBits(layers[0], want[0]));
  EXPECT_EQ(offloader->stats().pinned_bytes, pinned);
}

TEST_P(ActivationOffloadTest, AViewOfAnotherSlotStaysOnTheDevice) {
  auto offloader = *ActivationOffloader::Create(kDev);
  Tensor whole = DeviceTensor({6, 4}, 2.0f);
  Tensor rows = *whole.Slice(2, 4);  // Shares memory, another view.
  std::vector<Tensor*> slots = {&whole, &rows};
  auto group = offloader->Offload(slots);
  ASSERT_TRUE(group.ok());
  EXPECT_FALSE(whole.defined());
  EXPECT_TRUE(rows.defined());
  EXPECT_EQ(offloader->stats().kept_tensors, 1);
  ASSERT_TRUE(offloader->Restore(group->get(), slots).ok());
  EXPECT_TRUE(SameBits(whole, DeviceTensor({6, 4}, 2.0f)));
}

TEST_P(ActivationOffloadTest, MisuseIsNamed) {
  auto offloader = *ActivationOffloader::Create(kDev);
  Tensor a = DeviceTensor({4}, 1.0f);
  Tensor host = *Tensor::FromVector({1.0f, 2.0f}, {2});
  Tensor* host_slot = &host;
  auto bad = offloader->Offload({host_slot});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fp32[2] on cpu"), std::string::npos)
      << bad.status();

  auto group = *offloader->Offload({&a});
  Tensor other;
  absl::Status s = offloader->Restore(group.get(), {&a, &other});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  a = DeviceTensor({4}, 0.0f);
  s = offloader->Restore(group.get(), {&a});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("refilled"), std::string::npos) << s;
  a = Tensor();
  ASSERT_TRUE(offloader->Restore(group.get(), {&a}).ok());
  s = offloader->Restore(group.get(), {&a});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

INSTANTIATE_TEST_SUITE_P(Streams, ActivationOffloadTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Deferred" : "Synchronous";
                         });

TEST(ActivationOffloadCpuTest, TheCpuHasNothingToOffload) {
  auto r = ActivationOffloader::Create(Device::CPU());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("--cpu-offloading"), std::string::npos)
      << r.status();
}

// The control that gives the tests above their teeth: on a deferred side
// stream a copy has not happened until it is waited for, so code that
// skipped a wait would read stale memory.
TEST(DeferredSideStreamTest, ACopyHappensOnlyWhenWaitedFor) {
  testing::InstallDeferredSideStreams();
  {
    auto stream = *SideStream::Create(kDev);
    ASSERT_TRUE(stream->asynchronous());
    std::vector<float> pinned = {1.0f, 2.0f, 3.0f};
    Tensor dst = *Tensor::Zeros({3}, DType::kFloat32).To(kDev);
    ASSERT_TRUE(stream->CopyToDevice(dst.raw_data(), pinned.data(), 12).ok());
    auto event = *stream->Record();
    // NaN bytes until the wait.
    for (float v : dst.To(Device::CPU())->ToFloats()) EXPECT_NE(v, v);
    ASSERT_TRUE(event.WaitOnCurrentStream().ok());
    EXPECT_EQ(dst.To(Device::CPU())->ToFloats(), pinned);
  }
  testing::RemoveDeferredSideStreams();
  EXPECT_FALSE((*SideStream::Create(kDev))->asynchronous());
}

TEST(SideStreamTest, HooksAreAllOrNone) {
  SideStreamHooks half;
  half.create_stream = [](Device) -> void* { return nullptr; };
  const absl::Status s = RegisterSideStreamHooks(DeviceType::kCUDA, half);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_FALSE(SideStream::Create(Device::CPU()).ok());
}

}  // namespace
}  // namespace mcc
