#include "core/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 7, 64, 1001}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, 3, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << i;
  }
}

TEST(ThreadPoolTest, NestedLoopsRunSerially) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  pool.ParallelFor(10, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      pool.ParallelFor(5, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
    }
  });
  EXPECT_EQ(total.load(), 50);
}

TEST(ThreadPoolTest, ManyLoopsInARow) {
  ThreadPool pool(2);
  int64_t sum = 0;
  for (int k = 0; k < 2000; ++k) {
    std::atomic<int64_t> s{0};
    pool.ParallelFor(100, 10, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) s += i;
    });
    sum += s.load();
  }
  EXPECT_EQ(sum, 2000 * 4950);
}

// Polling workers (SetSpinMicros) take every loop's chunks exactly once,
// whether the next loop comes while they poll or after they have gone to
// sleep, and the pool shuts down while they poll.
TEST(ThreadPoolTest, PollingWorkersRunEveryLoopOnce) {
  for (int64_t spin : {int64_t{50}, int64_t{1000000}}) {
    ThreadPool pool(3);
    pool.SetSpinMicros(spin);
    for (int k = 0; k < 500; ++k) {
      std::vector<std::atomic<int>> hits(97);
      pool.ParallelFor(97, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < 97; ++i) ASSERT_EQ(hits[i].load(), 1) << i;
      // Every 100th loop after the short poll has run out.
      if (k % 100 == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }  // The second pool is destroyed while its workers poll (1 s).
}

}  // namespace
}  // namespace mcc
