#ifndef TRAINING_EXIT_CONDITIONS_H_
#define TRAINING_EXIT_CONDITIONS_H_

// When a training run stops before --train-iters on its own, as Megatron's
// --exit-signal-handler, --exit-duration-in-mins and --exit-interval: on a
// pre-emption signal (SLURM sends SIGTERM before it kills a job), after a
// wall-clock budget, or at an iteration multiple. The caller finishes the
// step in hand, saves a checkpoint and exits 0, so the job resumes where it
// stopped.
//
// Every rank must stop after the same iteration, or the ones that go on
// wait for ever on the ones that left. A signal reaches ranks at different
// moments and their clocks differ, so the signal and duration conditions
// are agreed with one small all-reduce (MAX) over the world after each step;
// the interval needs none. Without those two conditions After() makes no
// collective call.
//
// Thread-safety: one thread calls After(). Only one ExitConditions watching
// the signal may exist at a time (it owns the process's SIGTERM handler and
// restores the previous one when destroyed).

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/comm/process_group.h"

namespace mcc {
namespace training {

struct ExitOptions {
  // Stop after the step in hand when this process gets SIGTERM.
  bool on_signal = false;
  // Stop after the first step that ends this long after `start` (infinite:
  // never).
  absl::Duration max_duration = absl::InfiniteDuration();
  // Stop after an iteration that is a multiple of this (0: never).
  int64_t interval = 0;
};

enum class ExitReason { kNone, kSignal, kDuration, kInterval };

// "SIGTERM received (--exit-signal-handler)", ... for the log.
std::string DescribeExitReason(ExitReason reason, const ExitOptions& options);

class ExitConditions {
 public:
  // Installs the SIGTERM handler when options.on_signal. `world` spans every
  // rank of the job (null for a single process); not owned, it must outlive
  // this object. The duration counts from `start`.
  static absl::StatusOr<std::unique_ptr<ExitConditions>> Create(
      const ExitOptions& options, absl::Time start, comm::ProcessGroup* world);
  ~ExitConditions();
  ExitConditions(const ExitConditions&) = delete;
  ExitConditions& operator=(const ExitConditions&) = delete;

  // Sets the world once the job has joined it (Create may run before, so
  // that a signal during setup is caught, not fatal).
  void SetWorld(comm::ProcessGroup* world) { world_ = world; }

  // After `iteration` is done: why the run should stop now, the same on
  // every rank (kNone: go on). Collective over `world` when a signal or a
  // duration is watched.
  absl::StatusOr<ExitReason> After(int64_t iteration);

  const ExitOptions& options() const { return options_; }

 private:
  ExitConditions(const ExitOptions& options, absl::Time start,
                 comm::ProcessGroup* world);

  ExitOptions options_;
  absl::Time start_;
  comm::ProcessGroup* world_;
  bool installed_handler_ = false;
};

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_EXIT_CONDITIONS_H_
