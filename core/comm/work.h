#ifndef CORE_COMM_WORK_H_
#define CORE_COMM_WORK_H_

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace mcc {
namespace comm {

// Seconds the calling thread has spent blocked in Work::Wait, over its
// life: the time it waited on peers. A rank's step time less this is its own
// busy time, which the straggler report compares across ranks (a rank that
// waits on a slow peer is not slow itself).
double ThreadSecondsBlockedInWait();

// The handle of one asynchronous operation (process_group.h says when its
// operation runs and how it fails). Callers wait on it; backends (backend.h)
// make and complete it.
class Work {
 public:
  // ---- What a caller uses. Wait may be called from any thread, any number
  // of times; every call returns the same final status once the operation
  // has finished.

  // Waits up to timeout; DeadlineExceeded (naming the operation) when the
  // operation has not finished by then. A device-ordered work (see
  // SetDeviceWait) does not block: it orders the caller's current stream
  // after the operation and returns at once.
  absl::Status Wait(absl::Duration timeout);
  // Waits until the operation finishes: it fails by itself once its own
  // timeout passes, so this never hangs.
  absl::Status Wait();
  // Whether the operation has finished, without blocking.
  bool IsCompleted();
  // The operation, group, rank and sequence number, as errors name them.
  const std::string& what() const { return what_; }

  // ---- What a backend uses to make and complete works.

  // `what` names the operation, group, rank and sequence number for errors.
  Work(std::string what, absl::Duration default_timeout);
  // A work completed by polling: waiter(timeout, &finished) waits up to
  // timeout and sets finished once the operation is over (successfully or
  // not), returning its status (used for point-to-point transfers and CUDA
  // streams). It may be called again while not finished.
  using Waiter = std::function<absl::Status(absl::Duration, bool*)>;
  Work(std::string what, absl::Duration default_timeout, Waiter waiter);
  // A work already finished with `status`.
  static std::shared_ptr<Work> Done(absl::Status status);
  // A work that finishes when every one of `works` has (all already
  // issued, none device-ordered): its status is the first failure among
  // them, else OK.
  static std::shared_ptr<Work> All(std::string what,
                                   absl::Duration default_timeout,
                                   std::vector<std::shared_ptr<Work>> works);

  // Marks the operation finished (backends call this once).
  void MarkDone(absl::Status status);
  // Runs fn once with the final status when the operation is seen to finish
  // (at once if it already has). A waiter released by MarkDone sees fn's
  // effects: fn runs before waiters wake. For the flight recorder.
  void SetOnDone(std::function<void(const absl::Status&)> fn);
  // Makes the work device-ordered, as a CUDA work in PyTorch: Wait calls
  // device_wait (which makes the calling thread's current stream wait for
  // the operation) and returns its error, or the operation's if it has
  // already failed, without blocking the host; the backend's watchdog calls
  // MarkDone when the operation has finished. Set before the work is shared.
  void SetDeviceWait(std::function<absl::Status()> device_wait);

 private:
  // With status_ set and `lock` held: runs on_done_ (unlocked) and only then
  // marks the work done and wakes waiters, so they see its effects.
  void FinishLocked(std::unique_lock<std::mutex>& lock);

  std::function<absl::Status()> device_wait_;
  std::function<void(const absl::Status&)> on_done_;
  std::string what_;
  absl::Duration default_timeout_;
  Waiter waiter_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  // MarkDone has the final status and is running on_done_; waiters still
  // wait, and a late SetOnDone runs its callback at once.
  bool finishing_ = false;
  absl::Status status_;
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_WORK_H_
