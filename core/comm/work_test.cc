// Work's completion order: a thread released by Wait sees what the on-done
// callback did (the flight recorder marks an entry finished there), both for
// works a backend marks done and for works that wait on others (Work::All).
#include "core/comm/work.h"

#include <atomic>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

// A callback slow enough that a waiter woken early would return first.
std::function<void(const absl::Status&)> SlowCallback(std::atomic<bool>* ran) {
  return [ran](const absl::Status&) {
    absl::SleepFor(absl::Milliseconds(100));
    ran->store(true);
  };
}

// A thread that waits on `work` and records whether the callback had run
// by the time Wait returned.
std::thread WaiterNotingCallback(const std::shared_ptr<Work>& work,
                                 const std::atomic<bool>* ran,
                                 std::atomic<bool>* saw_callback) {
  return std::thread([work, ran, saw_callback] {
    ASSERT_TRUE(work->Wait().ok());
    saw_callback->store(ran->load());
  });
}

TEST(WorkTest, MarkDoneRunsTheCallbackBeforeWaitersWake) {
  auto work = std::make_shared<Work>("op", absl::Seconds(10));
  std::atomic<bool> ran{false};
  work->SetOnDone(SlowCallback(&ran));
  std::atomic<bool> saw_callback{false};
  std::thread waiter = WaiterNotingCallback(work, &ran, &saw_callback);
  absl::SleepFor(absl::Milliseconds(20));
  work->MarkDone(absl::OkStatus());
  waiter.join();
  EXPECT_TRUE(saw_callback.load());
}

TEST(WorkTest, SecondWaiterOfAnAllWorkSeesTheCallback) {
  auto inner = std::make_shared<Work>("inner", absl::Seconds(10));
  std::shared_ptr<Work> all = Work::All("all", absl::Seconds(10), {inner});
  std::atomic<bool> ran{false};
  all->SetOnDone(SlowCallback(&ran));
  // The first waiter polls the inner work and then runs the callback; the
  // second arrives while the first is waiting.
  std::thread first([&] { ASSERT_TRUE(all->Wait().ok()); });
  absl::SleepFor(absl::Milliseconds(20));
  std::atomic<bool> saw_callback{false};
  std::thread second = WaiterNotingCallback(all, &ran, &saw_callback);
  absl::SleepFor(absl::Milliseconds(20));
  inner->MarkDone(absl::OkStatus());
  first.join();
  second.join();
  EXPECT_TRUE(ran.load());
  EXPECT_TRUE(saw_callback.load());
}

TEST(WorkTest, LateCallbackRunsAtOnceWithTheFinalStatus) {
  auto work = std::make_shared<Work>("op", absl::Seconds(10));
  work->MarkDone(absl::InternalError("boom"));
  absl::Status seen;
  work->SetOnDone([&](const absl::Status& s) { seen = s; });
  EXPECT_EQ(seen.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(work->Wait().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace comm
}  // namespace mcc
