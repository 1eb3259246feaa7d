#include "core/pinned_staging_pool.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/device_staging.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

using ::mcc::testing::TestDeviceCopiesFromHost;
using ::mcc::testing::TestDeviceCopiesToHost;

Tensor Ramp(int64_t n, float start) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return *Tensor::FromVector(v, {n});
}

std::vector<float> OnHost(const Tensor& t) {
  return t.To(Device::CPU())->ToFloats();
}

TEST(PinnedStagingPoolTest, StagesThroughTheCopyHookAndReusesBuffers) {
  PinnedStagingPool pool(Device::TestDevice());
  Tensor host = Ramp(100, 1.0f);
  Tensor ids = *Tensor::FromInts({3, 1, 4, 1, 5, 9}, {2, 3});
  const int64_t up = TestDeviceCopiesFromHost();
  const int64_t down = TestDeviceCopiesToHost();
  auto a = pool.Stage(host);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = pool.Stage(ids);
  ASSERT_TRUE(b.ok()) << b.status();
  // One copy each, through the hook; nothing read back.
  EXPECT_EQ(TestDeviceCopiesFromHost() - up, 2);
  EXPECT_EQ(TestDeviceCopiesToHost() - down, 0);
  EXPECT_EQ(a->device(), Device::TestDevice());
  EXPECT_EQ(b->shape(), (Shape{2, 3}));
  EXPECT_EQ(b->dtype(), DType::kInt64);
  // The source may change at once: the device copy does not follow.
  host.Fill(-1.0);
  EXPECT_EQ(OnHost(*a), Ramp(100, 1.0f).ToFloats());
  EXPECT_EQ(b->To(Device::CPU())->ToDoubles(),
            (std::vector<double>{3, 1, 4, 1, 5, 9}));
  EXPECT_EQ(pool.num_buffers(), 2);
  EXPECT_EQ(pool.num_in_flight(), 2);
  // In flight, a buffer is not reused.
  ASSERT_TRUE(pool.Stage(Ramp(100, 0.0f)).ok());
  EXPECT_EQ(pool.num_buffers(), 3);
  // After Recycle, a step of the same sizes allocates nothing.
  ASSERT_TRUE(pool.Recycle().ok());
  EXPECT_EQ(pool.num_in_flight(), 0);
  const size_t bytes = pool.pinned_bytes();
  for (int round = 0; round < 3; ++round) {
    auto x = pool.Stage(Ramp(100, 10.0f * round));
    auto y = pool.Stage(ids);
    auto z = pool.Stage(Ramp(100, 0.5f));
    ASSERT_TRUE(x.ok() && y.ok() && z.ok());
    EXPECT_EQ(OnHost(*x), Ramp(100, 10.0f * round).ToFloats());
    EXPECT_EQ(OnHost(*z), Ramp(100, 0.5f).ToFloats());
    ASSERT_TRUE(pool.Recycle().ok());
  }
  EXPECT_EQ(pool.num_buffers(), 3);
  EXPECT_EQ(pool.pinned_bytes(), bytes);
}

TEST(PinnedStagingPoolTest, OnTheCpuHandsTensorsBack) {
  PinnedStagingPool pool(Device::CPU());
  Tensor host = Ramp(8, 0.0f);
  auto staged = pool.Stage(host);
  ASSERT_TRUE(staged.ok());
  EXPECT_TRUE(staged->SharesStorageWith(host));
  EXPECT_EQ(pool.num_buffers(), 0);
}

TEST(PinnedStagingPoolTest, RefusesWhatIsNotOnTheHost) {
  PinnedStagingPool pool(Device::TestDevice());
  auto undefined = pool.Stage(Tensor());
  EXPECT_EQ(undefined.status().code(), absl::StatusCode::kInvalidArgument);
  auto on_device = pool.Stage(*Ramp(4, 0.0f).To(Device::TestDevice()));
  EXPECT_EQ(on_device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(on_device.status().message().find("must be a CPU tensor"),
            std::string::npos)
      << on_device.status();
  EXPECT_FALSE(CopyToDeviceAsync(nullptr, Device::CPU(), nullptr, 4).ok());
}

// A device whose copies really are asynchronous: they run only when the
// stream is synchronised. A pool that reused a buffer in flight, or did not
// synchronise before reuse, would copy the wrong values.
struct Deferred {
  void* dst;
  Device device;
  const void* src;
  size_t bytes;
};
std::vector<Deferred>* g_queue = new std::vector<Deferred>;
int g_pinned_allocations = 0;

void* AllocateCounted(Device, size_t bytes) {
  ++g_pinned_allocations;
  return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
}
void FreeCounted(Device, void* ptr) { std::free(ptr); }
absl::Status CopyLater(void* dst, Device device, const void* src,
                       size_t bytes) {
  g_queue->push_back({dst, device, src, bytes});
  return absl::OkStatus();
}
absl::Status RunQueue(Device) {
  for (const Deferred& d : *g_queue) {
    absl::Status s = CopyBytes(d.dst, d.device, d.src, Device::CPU(), d.bytes);
    if (!s.ok()) return s;
  }
  g_queue->clear();
  return absl::OkStatus();
}

TEST(PinnedStagingPoolTest, KeepsBuffersUntilTheStreamHasPassedThem) {
  StagingHooks hooks;
  hooks.allocate_pinned = &AllocateCounted;
  hooks.free_pinned = &FreeCounted;
  hooks.copy_async = &CopyLater;
  hooks.synchronize = &RunQueue;
  RegisterStagingHooks(DeviceType::kTestDevice, hooks);
  Tensor last;  // Outlives the pool, which copies into it as it goes.
  {
    PinnedStagingPool pool(Device::TestDevice());
    for (int step = 0; step < 3; ++step) {
      std::vector<Tensor> staged;
      for (int i = 0; i < 4; ++i) {
        auto t = pool.Stage(Ramp(64, 100.0f * step + 10.0f * i));
        ASSERT_TRUE(t.ok()) << t.status();
        staged.push_back(*t);
      }
      EXPECT_EQ(g_queue->size(), 4u);  // Nothing copied yet.
      ASSERT_TRUE(pool.Recycle().ok());
      EXPECT_TRUE(g_queue->empty());
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(OnHost(staged[i]),
                  Ramp(64, 100.0f * step + 10.0f * i).ToFloats())
            << "step " << step << " micro-batch " << i;
      }
    }
    // Four buffers, allocated in the first step only.
    EXPECT_EQ(g_pinned_allocations, 4);
    // Destroyed with copies in flight: the pool waits for them first.
    auto staged = pool.Stage(Ramp(64, 5.0f));
    ASSERT_TRUE(staged.ok());
    last = *staged;
  }
  EXPECT_TRUE(g_queue->empty());
  EXPECT_EQ(OnHost(last), Ramp(64, 5.0f).ToFloats());
  RegisterStagingHooks(DeviceType::kTestDevice, {});
}

}  // namespace
}  // namespace mcc
