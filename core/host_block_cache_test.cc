#include "core/host_block_cache.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>

#include "core/allocator.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

bool Aligned(void* p) {
  return reinterpret_cast<uintptr_t>(p) % HostBlockCache::kGranule == 0;
}

TEST(HostBlockCacheTest, FreedBlockIsReusedForTheSameSize) {
  HostBlockCache cache(64 * kMiB);
  void* a = cache.Allocate(5 * kMiB + 3);
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(Aligned(a));
  std::memset(a, 0x5a, 5 * kMiB + 3);       // Every byte asked for is usable.
  EXPECT_EQ(cache.live_bytes(), 6 * kMiB);  // Whole 2 MiB granules.
  cache.Free(a);
  EXPECT_EQ(cache.live_bytes(), 0u);
  EXPECT_EQ(cache.cached_bytes(), 6 * kMiB);
  void* b = cache.Allocate(5 * kMiB);
  EXPECT_EQ(b, a);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.cached_bytes(), 0u);
  cache.Free(b);
}

TEST(HostBlockCacheTest, LiveBlocksAreNeverShared) {
  HostBlockCache cache(64 * kMiB);
  std::set<void*> seen;
  void* blocks[4];
  for (void*& p : blocks) {
    p = cache.Allocate(2 * kMiB);
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(seen.insert(p).second);
    std::memset(p, 1, 2 * kMiB);
  }
  cache.Free(blocks[1]);
  void* again = cache.Allocate(2 * kMiB);
  EXPECT_EQ(again, blocks[1]);
  void* fresh = cache.Allocate(2 * kMiB);  // The cache is empty now.
  EXPECT_EQ(seen.count(fresh), 0u);
  cache.Free(fresh);
  cache.Free(again);
  for (int i : {0, 2, 3}) cache.Free(blocks[i]);
  EXPECT_EQ(cache.live_bytes(), 0u);
}

TEST(HostBlockCacheTest, TakesNoBlockThatWastesMoreThanAQuarter) {
  HostBlockCache cache(256 * kMiB);
  void* big = cache.Allocate(16 * kMiB);
  cache.Free(big);
  void* small = cache.Allocate(8 * kMiB);  // 16 MiB would waste half.
  EXPECT_NE(small, big);
  void* close = cache.Allocate(14 * kMiB);  // Wastes 1/8: reused.
  EXPECT_EQ(close, big);
  cache.Free(small);
  cache.Free(close);
}

TEST(HostBlockCacheTest, CachedBytesStayWithinTheLimit) {
  HostBlockCache cache(10 * kMiB);
  void* a = cache.Allocate(8 * kMiB);
  void* b = cache.Allocate(4 * kMiB);
  void* c = cache.Allocate(12 * kMiB);  // Over the limit by itself.
  cache.Free(a);
  cache.Free(b);  // 12 MiB cached > 10: the oldest (a, 8 MiB) goes.
  EXPECT_EQ(cache.cached_bytes(), 4 * kMiB);
  cache.Free(c);
  EXPECT_EQ(cache.cached_bytes(), 4 * kMiB);
  cache.Release();
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

// Beyond 256 MiB, a process keeps no more cached than it ever had live.
TEST(HostBlockCacheTest, CacheFollowsThePeakOfLiveBytes) {
  HostBlockCache cache(size_t{4} << 30);
  // Blocks of sizes that never fit each other (each over 1.25x the last),
  // live one at a time: the peak is the largest, 300 MiB.
  for (size_t mib : {40, 60, 80, 110, 150, 200, 300}) {
    void* p = cache.Allocate(mib * kMiB);
    ASSERT_NE(p, nullptr) << mib;
    cache.Free(p);
    EXPECT_LE(cache.cached_bytes(), std::max<size_t>(256, mib) * kMiB) << mib;
  }
  // 300 MiB were live once: the newest blocks that fit in it stay.
  EXPECT_EQ(cache.cached_bytes(), 300 * kMiB);
  void* again = cache.Allocate(300 * kMiB);  // The latest size: still there.
  EXPECT_EQ(cache.hits(), 1);
  cache.Free(again);
}

TEST(HostBlockCacheTest, ZeroLimitCachesNothing) {
  HostBlockCache cache(0);
  void* a = cache.Allocate(3 * kMiB);
  cache.Free(a);
  EXPECT_EQ(cache.cached_bytes(), 0u);
  EXPECT_EQ(cache.hits(), 0);
}

TEST(HostBlockCacheTest, ImpossibleSizeFailsWithoutDying) {
  HostBlockCache cache(64 * kMiB);
  EXPECT_EQ(cache.Allocate(~size_t{0} - 10), nullptr);
  EXPECT_EQ(cache.Allocate(size_t{1} << 62), nullptr);
}

TEST(HostBlockCacheDeathTest, ForeignPointerDies) {
  HostBlockCache cache(64 * kMiB);
  int local = 0;
  EXPECT_DEATH(cache.Free(&local), "not handed out by this cache");
}

// The CPU allocator serves large tensors from its cache: a step that frees
// and takes the same buffer again gets the same (already backed) memory,
// and the allocator's counters still count tensor bytes.
TEST(CpuAllocatorTest, LargeTensorMemoryIsReusedAndCounted) {
  Allocator* cpu = GetAllocator(Device::CPU());
  const int64_t before = cpu->Stats().current_bytes;
  const void* first = nullptr;
  {
    Tensor t = Tensor::Empty({3, 1 << 20}, DType::kFloat32, Device::CPU());
    first = t.raw_data();
    EXPECT_EQ(cpu->Stats().current_bytes - before, 12 * int64_t{kMiB});
  }
  EXPECT_EQ(cpu->Stats().current_bytes, before);
  Tensor again = Tensor::Empty({3, 1 << 20}, DType::kFloat32, Device::CPU());
  EXPECT_EQ(again.raw_data(), first);
  Tensor small = Tensor::Empty({100}, DType::kFloat32, Device::CPU());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.raw_data()) % kCpuAlignment, 0u);
}

// Minor page faults of the calling thread so far.
int64_t ThreadMinorFaults() {
  rusage usage = {};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

// Faults taken while a tensor of `bytes` is taken, written whole and freed,
// after one warm-up round of the same.
int64_t FaultsOfSecondTake(int64_t bytes) {
  auto take_and_write = [bytes] {
    Tensor t = Tensor::Empty({bytes}, DType::kInt8, Device::CPU());
    std::memset(t.raw_data(), 1, bytes);
  };
  take_and_write();
  const int64_t before = ThreadMinorFaults();
  take_and_write();
  return ThreadMinorFaults() - before;
}

// Medium blocks (from kMinBlockBytes up) come from the cache too: once
// freed they stay mapped, on the main thread and on worker threads alike
// (glibc's heap gave them fresh addresses often enough to fault each
// take). A 768 KiB block is 192 pages: faulting it again would show ~192
// faults; a few stray ones are allowed.
TEST(CpuAllocatorTest, MediumTensorMemoryIsNotFaultedAgain) {
  constexpr int64_t kBytes = 768 << 10;
  static_assert(kBytes >= static_cast<int64_t>(HostBlockCache::kMinBlockBytes),
                "must take the cache path");
  for (int round = 0; round < 3; ++round) {
    EXPECT_LT(FaultsOfSecondTake(kBytes), 16) << "round " << round;
  }
  int64_t worker_faults = -1;
  std::thread worker([&] { worker_faults = FaultsOfSecondTake(kBytes); });
  worker.join();
  EXPECT_LT(worker_faults, 16);
}

TEST(HostBlockCacheTest, SmallBlocksUseTheSmallGranule) {
  EXPECT_EQ(HostBlockCache::BlockBytes(600 << 10), size_t{640} << 10);
  EXPECT_EQ(HostBlockCache::BlockBytes(HostBlockCache::kGranule - 1),
            HostBlockCache::kGranule);
  EXPECT_EQ(HostBlockCache::BlockBytes(5 * kMiB + 3), 6 * kMiB);
  EXPECT_EQ(HostBlockCache::BlockBytes(0), 0u);
  HostBlockCache cache(64 * kMiB);
  void* a = cache.Allocate(600 << 10);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 4096, 0u);
  std::memset(a, 3, 600 << 10);
  EXPECT_EQ(cache.live_bytes(), size_t{640} << 10);
  cache.Free(a);
  EXPECT_EQ(cache.Allocate(590 << 10), a);  // Wastes 1/16: reused.
  cache.Free(a);
}

}  // namespace
}  // namespace mcc
