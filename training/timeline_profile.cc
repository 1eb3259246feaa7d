#include "training/timeline_profile.h"

#include <filesystem>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/comm/call_observer.h"
#include "glog/logging.h"
#include "observability/trace.h"

namespace mcc {
namespace training {

absl::StatusOr<std::set<int>> ParseProfileRanks(const std::string& text,
                                                int world_size) {
  std::set<int> ranks;
  for (absl::string_view word :
       absl::StrSplit(text, absl::ByAnyChar(", "), absl::SkipEmpty())) {
    int rank = -1;
    if (!absl::SimpleAtoi(word, &rank) || rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--profile-ranks: '", word, "' is not a rank"));
    }
    if (rank >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--profile-ranks: rank ", rank,
                       " is not below the world size ", world_size));
    }
    ranks.insert(rank);
  }
  if (ranks.empty()) {
    return absl::InvalidArgumentError("--profile-ranks names no rank");
  }
  return ranks;
}

absl::Status CheckTimelineProfile(const TimelineProfileConfig& config,
                                  int64_t train_iters) {
  if (!config.enabled) return absl::OkStatus();
  if (config.start < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile-step-start ", config.start, " must not be negative"));
  }
  if (config.end <= config.start) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile-step-end ", config.end,
                     " must be above --profile-step-start ", config.start));
  }
  if (config.start >= train_iters) {
    return absl::InvalidArgumentError(
        absl::StrCat("--profile-step-start ", config.start,
                     ": the run has only ", train_iters,
                     " iterations (--train-iters), so nothing would be "
                     "profiled"));
  }
  if (config.dir.empty()) {
    return absl::InvalidArgumentError("--profile-dir must not be empty");
  }
  return absl::OkStatus();
}

TimelineProfile::TimelineProfile(TimelineProfileConfig config, int rank,
                                 std::function<absl::Status()> barrier)
    : config_(std::move(config)), rank_(rank), barrier_(std::move(barrier)) {}

TimelineProfile::~TimelineProfile() {
  if (recording_) {
    comm::SetCallObserver(nullptr);
    observability::TraceRecorder::Global().Disable();
  }
}

void TimelineProfile::LabelGroup(const std::string& group,
                                 const std::string& label) {
  labels_.emplace_back(group, label);
}

absl::Status TimelineProfile::BeforeStep(int64_t iteration) {
  if (!config_.enabled) return absl::OkStatus();
  observability::TraceRecorder& trace = observability::TraceRecorder::Global();
  if (recording_) {
    trace.SetStep(iteration);
    return absl::OkStatus();
  }
  // Megatron's test: the count of iterations done equals the start.
  if (iteration - 1 != config_.start) return absl::OkStatus();
  if (absl::Status s = barrier_(); !s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("--profile: the barrier at the start of the "
                               "window failed: ",
                               s.message()));
  }
  trace.MarkClockSync();
  if (!config_.ranks.count(rank_)) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(config_.dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--profile-dir ", config_.dir, ": cannot create it: ", ec.message()));
  }
  trace.Clear();
  trace.NameTrack(0, "training loop");
  trace.SetStep(iteration);
  trace.Enable(rank_);
  comm_ = std::make_unique<observability::CommTraceObserver>(&trace);
  for (const auto& [group, label] : labels_) comm_->LabelGroup(group, label);
  comm::SetCallObserver(comm_.get());
  recording_ = true;
  LOG(INFO) << "--profile: rank " << rank_ << " records iterations "
            << config_.start + 1 << " to " << config_.end;
  return absl::OkStatus();
}

absl::Status TimelineProfile::AfterStep(int64_t iteration) {
  if (!recording_ || iteration != config_.end) return absl::OkStatus();
  return Stop();
}

absl::Status TimelineProfile::Finish() {
  return recording_ ? Stop() : absl::OkStatus();
}

absl::Status TimelineProfile::Stop() {
  observability::TraceRecorder& trace = observability::TraceRecorder::Global();
  comm::SetCallObserver(nullptr);
  trace.Disable();
  trace.SetStep(-1);
  recording_ = false;
  // Callbacks of calls still in flight keep the observer: it stays alive
  // (owned here) until the profile is destroyed, and records nothing more.
  const std::string path =
      absl::StrCat(config_.dir, "/trace_rank", rank_, ".json");
  if (absl::Status s = trace.WriteChromeTrace(path); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--profile-dir: ", s.message()));
  }
  LOG(INFO) << "--profile: rank " << rank_ << " wrote its timeline to " << path
            << " (tools/merge_traces " << config_.dir << " merges the ranks')";
  trace.Clear();
  return absl::OkStatus();
}

}  // namespace training
}  // namespace mcc
