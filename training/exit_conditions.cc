#include "training/exit_conditions.h"

#include <signal.h>

#include <atomic>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "core/tensor.h"

namespace mcc {
namespace training {
namespace {

// Set by the handler; read after each step. A lock-free atomic is safe to
// store from a signal handler.
std::atomic<bool> sigterm_received{false};
static_assert(std::atomic<bool>::is_always_lock_free);

struct sigaction previous_sigterm_action;
std::atomic<bool> handler_installed{false};

void OnSigterm(int) { sigterm_received.store(true); }

}  // namespace

std::string DescribeExitReason(ExitReason reason, const ExitOptions& options) {
  switch (reason) {
    case ExitReason::kNone:
      return "none";
    case ExitReason::kSignal:
      return "SIGTERM received (--exit-signal-handler)";
    case ExitReason::kDuration:
      return absl::StrCat("the run has lasted ",
                          absl::FormatDuration(options.max_duration),
                          " (--exit-duration-in-mins)");
    case ExitReason::kInterval:
      return absl::StrCat("the iteration is a multiple of ", options.interval,
                          " (--exit-interval)");
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<ExitConditions>> ExitConditions::Create(
    const ExitOptions& options, absl::Time start, comm::ProcessGroup* world) {
  if (options.interval < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "exit interval must be 0 (none) or positive, got ", options.interval));
  }
  if (options.max_duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("exit duration must be positive, got ",
                     absl::FormatDuration(options.max_duration)));
  }
  std::unique_ptr<ExitConditions> conditions(
      new ExitConditions(options, start, world));
  if (options.on_signal) {
    if (handler_installed.exchange(true)) {
      return absl::FailedPreconditionError(
          "another ExitConditions already watches SIGTERM");
    }
    sigterm_received.store(false);
    struct sigaction action = {};
    action.sa_handler = OnSigterm;
    sigemptyset(&action.sa_mask);
    // Restart interrupted system calls: the step in hand must finish.
    action.sa_flags = SA_RESTART;
    if (sigaction(SIGTERM, &action, &previous_sigterm_action) != 0) {
      handler_installed.store(false);
      return absl::InternalError("cannot install the SIGTERM handler");
    }
    conditions->installed_handler_ = true;
  }
  return conditions;
}

ExitConditions::ExitConditions(const ExitOptions& options, absl::Time start,
                               comm::ProcessGroup* world)
    : options_(options), start_(start), world_(world) {}

ExitConditions::~ExitConditions() {
  if (installed_handler_) {
    sigaction(SIGTERM, &previous_sigterm_action, nullptr);
    handler_installed.store(false);
  }
}

absl::StatusOr<ExitReason> ExitConditions::After(int64_t iteration) {
  const bool watch_duration = options_.max_duration != absl::InfiniteDuration();
  if (options_.on_signal || watch_duration) {
    int64_t signalled = options_.on_signal && sigterm_received.load() ? 1 : 0;
    int64_t overdue =
        watch_duration && absl::Now() - start_ >= options_.max_duration ? 1 : 0;
    if (world_ != nullptr && world_->size() > 1) {
      MCC_ASSIGN_OR_RETURN(Tensor t,
                           Tensor::FromInts({signalled, overdue}, {2}));
      MCC_RETURN_IF_ERROR(world_->AllReduceSync(&t, comm::ReduceOp::kMax));
      signalled = t.data<int64_t>()[0];
      overdue = t.data<int64_t>()[1];
    }
    if (signalled != 0) return ExitReason::kSignal;
    if (overdue != 0) return ExitReason::kDuration;
  }
  if (options_.interval > 0 && iteration % options_.interval == 0) {
    return ExitReason::kInterval;
  }
  return ExitReason::kNone;
}

}  // namespace training
}  // namespace mcc
