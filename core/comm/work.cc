#include "core/comm/work.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace mcc {
namespace comm {

Work::Work(std::string what, absl::Duration default_timeout)
    : what_(std::move(what)), default_timeout_(default_timeout) {}

Work::Work(std::string what, absl::Duration default_timeout, Waiter waiter)
    : what_(std::move(what)),
      default_timeout_(default_timeout),
      waiter_(std::move(waiter)) {}

std::shared_ptr<Work> Work::Done(absl::Status status) {
  auto work = std::make_shared<Work>("", absl::ZeroDuration());
  work->MarkDone(std::move(status));
  return work;
}

void Work::MarkDone(absl::Status status) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_ || finishing_) return;
  status_ = std::move(status);
  FinishLocked(lock);
}

void Work::FinishLocked(std::unique_lock<std::mutex>& lock) {
  // on_done runs before waiters wake, so a caller that waited on this work
  // sees its effects (the flight recorder's entry is "completed"); a
  // SetOnDone meanwhile runs its callback at once.
  finishing_ = true;
  std::function<void(const absl::Status&)> on_done;
  on_done.swap(on_done_);
  if (on_done) {
    const absl::Status final_status = status_;
    lock.unlock();
    on_done(final_status);
    lock.lock();
  }
  done_ = true;
  cv_.notify_all();
}

void Work::SetOnDone(std::function<void(const absl::Status&)> fn) {
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_ && !finishing_) {
      on_done_ = std::move(fn);
      return;
    }
    status = status_;
  }
  fn(status);
}

std::shared_ptr<Work> Work::All(std::string what,
                                absl::Duration default_timeout,
                                std::vector<std::shared_ptr<Work>> works) {
  // Each work fails by itself at its own deadline; this one waits for them
  // in turn (they are all under way) within the caller's timeout.
  auto waiter = [works = std::move(works)](absl::Duration timeout,
                                           bool* finished) -> absl::Status {
    const absl::Time until = timeout == absl::InfiniteDuration()
                                 ? absl::InfiniteFuture()
                                 : absl::Now() + timeout;
    for (const std::shared_ptr<Work>& w : works) {
      absl::Status s =
          w->Wait(std::max(absl::ZeroDuration(), until - absl::Now()));
      if (!w->IsCompleted()) return absl::DeadlineExceededError("not finished");
      if (!s.ok()) {
        *finished = true;
        return s;
      }
    }
    *finished = true;
    return absl::OkStatus();
  };
  return std::make_shared<Work>(std::move(what), default_timeout,
                                std::move(waiter));
}

void Work::SetDeviceWait(std::function<absl::Status()> device_wait) {
  device_wait_ = std::move(device_wait);
}

bool Work::IsCompleted() {
  if (device_wait_) {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  Wait(absl::ZeroDuration()).IgnoreError();
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

absl::Status Work::Wait() {
  return Wait(waiter_ ? default_timeout_ : absl::InfiniteDuration());
}

namespace {
thread_local double seconds_blocked_in_wait = 0;
}  // namespace

double ThreadSecondsBlockedInWait() { return seconds_blocked_in_wait; }

absl::Status Work::Wait(absl::Duration timeout) {
  if (device_wait_) {
    absl::Status ordered = device_wait_();
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ && !status_.ok()) return status_;
    return ordered;
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (done_) return status_;
  // Counted however the wait ends.
  struct CountBlocked {
    std::chrono::steady_clock::time_point from;
    ~CountBlocked() {
      seconds_blocked_in_wait +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - from)
              .count();
    }
  } count_blocked{std::chrono::steady_clock::now()};
  if (waiter_) {
    bool finished = false;
    absl::Status s = waiter_(timeout, &finished);
    if (finished) {
      // Another thread waiting meanwhile waits on the condition variable
      // (waiter_ is gone) until the callback has run.
      status_ = std::move(s);
      waiter_ = nullptr;
      FinishLocked(lock);
    }
  } else if (!done_) {
    if (timeout == absl::InfiniteDuration()) {
      cv_.wait(lock, [this] { return done_; });
    } else {
      cv_.wait_until(lock, absl::ToChronoTime(absl::Now() + timeout),
                     [this] { return done_; });
    }
  }
  if (!done_) {
    return absl::DeadlineExceededError(absl::StrCat(
        what_, ": Wait timed out after ", absl::FormatDuration(timeout),
        " (the operation has not finished)"));
  }
  return status_;
}

}  // namespace comm
}  // namespace mcc
