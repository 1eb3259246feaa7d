#ifndef TRAINING_TIMELINE_PROFILE_H_
#define TRAINING_TIMELINE_PROFILE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "observability/comm_trace.h"

namespace mcc {
namespace training {

// train --profile: which steps and ranks record a timeline, and where.
struct TimelineProfileConfig {
  bool enabled = false;
  // Megatron's window: recording starts before the step that begins with
  // `start` iterations done and stops after the step that brings the count
  // to `end`, i.e. the steps logged as iterations start + 1 ... end.
  int64_t start = 10;
  int64_t end = 12;
  std::set<int> ranks = {0};  // Global ranks.
  std::string dir = "profile";
};

// "0 1", "0,1" or "0, 1" (Megatron takes a list of words, Abseil a comma
// list): global ranks, each below world_size. Errors name --profile-ranks.
absl::StatusOr<std::set<int>> ParseProfileRanks(const std::string& text,
                                                int world_size);

// Checks a window against the run; errors name the flag.
absl::Status CheckTimelineProfile(const TimelineProfileConfig& config,
                                  int64_t train_iters);

// Drives the trace recorder over the training loop: at the window's first
// step every rank passes a barrier (so tools/merge_traces can align the
// ranks' clocks on it) and the profiled ranks start recording, collectives
// and p2p calls included; after its last step they write
// <dir>/trace_rank<R>.json (a Chrome trace; Perfetto and chrome://tracing
// open it).
//
// Collective: BeforeStep calls `barrier` on every rank at the window's
// first step, so every rank must call it with the same iterations.
// Thread-safety: one thread (the training loop) calls it.
// Errors: a trace that cannot be written fails AfterStep / Finish, naming
// the file.
class TimelineProfile {
 public:
  TimelineProfile(TimelineProfileConfig config, int rank,
                  std::function<absl::Status()> barrier);
  ~TimelineProfile();
  TimelineProfile(const TimelineProfile&) = delete;
  TimelineProfile& operator=(const TimelineProfile&) = delete;

  // Names a process group's role on the timeline ("pp", "dp", ...).
  void LabelGroup(const std::string& group, const std::string& label);

  // Around each step (1-based, as logged).
  absl::Status BeforeStep(int64_t iteration);
  absl::Status AfterStep(int64_t iteration);
  // Writes what was recorded if the run ended inside the window.
  absl::Status Finish();
  bool recording() const { return recording_; }

 private:
  absl::Status Stop();

  TimelineProfileConfig config_;
  int rank_;
  std::function<absl::Status()> barrier_;
  std::unique_ptr<observability::CommTraceObserver> comm_;
  std::vector<std::pair<std::string, std::string>> labels_;
  bool recording_ = false;
};

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_TIMELINE_PROFILE_H_
