// LtPlanCache: a hit returns the stored plan without building, distinct keys
// build distinct plans, the least recently used plan goes past the bound
// (and lives on while a caller holds it), errors are not stored, and
// concurrent misses on one key build once.
#include "core/ops/cuda/lt_plan_cache.h"

#include <atomic>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

struct Plan {
  int value = 0;
  std::atomic<int>* destroyed = nullptr;
  ~Plan() {
    if (destroyed) ++*destroyed;
  }
};

using Cache = LtPlanCache<int, Plan>;

// make() for `value`, counting its calls.
auto Maker(int value, int* calls, std::atomic<int>* destroyed = nullptr) {
  return [=]() -> absl::StatusOr<std::unique_ptr<Plan>> {
    ++*calls;
    auto p = std::make_unique<Plan>();
    p->value = value;
    p->destroyed = destroyed;
    return std::move(p);
  };
}

TEST(LtPlanCacheTest, AHitReturnsTheStoredPlanWithoutBuilding) {
  Cache cache(4);
  int calls = 0;
  absl::StatusOr<std::shared_ptr<Plan>> first =
      cache.GetOrMake(7, Maker(70, &calls));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::shared_ptr<Plan>> again =
      cache.GetOrMake(7, Maker(71, &calls));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(again->get(), first->get());
  EXPECT_EQ((*again)->value, 70);
  const LtPlanCacheCounts c = cache.Counts();
  EXPECT_EQ(c.hits, 1);
  EXPECT_EQ(c.misses, 1);
  EXPECT_EQ(c.size, 1);
}

TEST(LtPlanCacheTest, DistinctKeysBuildDistinctPlans) {
  Cache cache(4);
  int calls = 0;
  auto a = cache.GetOrMake(1, Maker(10, &calls));
  auto b = cache.GetOrMake(2, Maker(20, &calls));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(calls, 2);
  EXPECT_NE(a->get(), b->get());
  EXPECT_EQ((*cache.GetOrMake(1, Maker(0, &calls)))->value, 10);
  EXPECT_EQ((*cache.GetOrMake(2, Maker(0, &calls)))->value, 20);
  EXPECT_EQ(calls, 2);
}

TEST(LtPlanCacheTest, TheLeastRecentlyUsedPlanGoesPastTheBound) {
  std::atomic<int> destroyed{0};
  Cache cache(2);
  int calls = 0;
  std::shared_ptr<Plan> held =
      *cache.GetOrMake(1, Maker(10, &calls, &destroyed));
  ASSERT_TRUE(cache.GetOrMake(2, Maker(20, &calls, &destroyed)).ok());
  ASSERT_TRUE(cache.GetOrMake(1, Maker(0, &calls)).ok());  // 1 used last.
  ASSERT_TRUE(cache.GetOrMake(3, Maker(30, &calls, &destroyed)).ok());
  EXPECT_EQ(calls, 3);
  LtPlanCacheCounts c = cache.Counts();
  EXPECT_EQ(c.size, 2);
  EXPECT_EQ(c.evictions, 1);
  EXPECT_EQ(destroyed.load(), 1);  // 2's plan: nobody held it.
  // 1 and 3 stay; 2 is built again (evicting 1, still alive while held).
  ASSERT_TRUE(cache.GetOrMake(3, Maker(0, &calls)).ok());
  ASSERT_TRUE(cache.GetOrMake(2, Maker(21, &calls, &destroyed)).ok());
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_EQ(held->value, 10);
  held.reset();
  EXPECT_EQ(destroyed.load(), 2);
  c = cache.Counts();
  EXPECT_EQ(c.size, 2);
  EXPECT_EQ(c.evictions, 2);
}

TEST(LtPlanCacheTest, AnErrorIsReturnedAndNotStored) {
  Cache cache(2);
  int calls = 0;
  auto fails = [&]() -> absl::StatusOr<std::unique_ptr<Plan>> {
    ++calls;
    return absl::InternalError("cublasLtMatrixLayoutCreate: planted");
  };
  absl::StatusOr<std::shared_ptr<Plan>> r = cache.GetOrMake(5, fails);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(cache.Counts().size, 0);
  ASSERT_TRUE(cache.GetOrMake(5, Maker(50, &calls)).ok());
  EXPECT_EQ(calls, 2);
}

TEST(LtPlanCacheTest, ConcurrentMissesOnOneKeyBuildOnce) {
  Cache cache(8);
  std::atomic<int> calls{0};
  std::vector<std::thread> threads;
  std::vector<Plan*> seen(8, nullptr);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto r = cache.GetOrMake(
            i % 4, [&]() -> absl::StatusOr<std::unique_ptr<Plan>> {
              ++calls;
              return std::make_unique<Plan>();
            });
        ASSERT_TRUE(r.ok());
        if (i % 4 == 0) {
          if (seen[t] == nullptr) seen[t] = r->get();
          EXPECT_EQ(seen[t], r->get());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(calls.load(), 4);
  for (Plan* p : seen) EXPECT_EQ(p, seen[0]);
  EXPECT_EQ(cache.Counts().hits, 8 * 200 - 4);
}

TEST(LtPlanCacheTest, EachDeviceHasItsOwnBoundedCache) {
  PerDeviceLtPlanCaches<int, Plan> caches(3, 1);
  ASSERT_NE(caches.Of(0), nullptr);
  ASSERT_NE(caches.Of(2), nullptr);
  EXPECT_EQ(caches.Of(3), nullptr);
  EXPECT_EQ(caches.Of(-1), nullptr);
  EXPECT_NE(caches.Of(0), caches.Of(1));
  int calls = 0;
  ASSERT_TRUE(caches.Of(0)->GetOrMake(1, Maker(10, &calls)).ok());
  ASSERT_TRUE(caches.Of(1)->GetOrMake(2, Maker(20, &calls)).ok());
  // Device 1's plan did not evict device 0's (capacity 1 each).
  EXPECT_EQ((*caches.Of(0)->GetOrMake(1, Maker(0, &calls)))->value, 10);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(caches.Of(1)->capacity(), 1u);
}

TEST(LtPlanCacheTest, AlignmentIsTheLargestPowerOfTwoUpTo256) {
  EXPECT_EQ(LtAlignmentOf(reinterpret_cast<const void*>(uintptr_t{4096})),
            256u);
  EXPECT_EQ(LtAlignmentOf(reinterpret_cast<const void*>(uintptr_t{256 + 16})),
            16u);
  EXPECT_EQ(LtAlignmentOf(reinterpret_cast<const void*>(uintptr_t{258})), 2u);
  EXPECT_EQ(LtAlignmentOf(reinterpret_cast<const void*>(uintptr_t{257})), 1u);
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
