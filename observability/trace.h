#ifndef OBSERVABILITY_TRACE_H_
#define OBSERVABILITY_TRACE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace observability {

// One span of work on one track of one rank: a Chrome trace "complete"
// event (ph "X"). Times are microseconds on this process's steady clock.
struct TraceEvent {
  std::string name;      // "forward mb 3", "all_reduce #512"
  std::string category;  // "compute", "comm", "p2p", "optimizer", ...
  int64_t start_us = 0;
  int64_t duration_us = 0;
  int track = 0;  // Becomes the thread id: one row per track in the viewer.
  std::vector<std::pair<std::string, std::string>> args;
};

// Collects a rank's trace events and writes them as a Chrome trace file
// (JSON object format), which Perfetto and chrome://tracing open.
//
// Disabled until Enable(); Record on a disabled recorder does nothing, so
// instrumentation costs one relaxed load when profiling is off.
// Thread-safety: every method may be called from any thread.
// Errors: Write returns an error naming the file; recorded events are kept.
class TraceRecorder {
 public:
  // The process's recorder, used by the instrumentation points.
  static TraceRecorder& Global();

  // Starts recording for `rank` (the trace's pid) and names the tracks.
  void Enable(int rank);
  void Disable();
  bool enabled() const;
  void NameTrack(int track, std::string name);

  // Microseconds on the steady clock the events use.
  static int64_t NowMicros();
  static int64_t ToMicros(std::chrono::steady_clock::time_point t);
  // The training iteration events belong to: Record adds it as the "step"
  // argument while it is >= 0 (train sets it; -1 by default).
  void SetStep(int64_t step) { step_.store(step, std::memory_order_relaxed); }
  int64_t step() const { return step_.load(std::memory_order_relaxed); }
  // Marks the moment this rank left a barrier that every rank passed at
  // once: tools/merge_traces aligns the ranks' clocks on it.
  void MarkClockSync();

  // Adds the "step" argument (see SetStep) and "cpu_us": the CPU time the
  // calling thread used since it last recorded an event (since its first
  // record: omitted). An event recorded, as the pipeline executor's are,
  // by the thread that did the work, right after it, whose previous record
  // came right before it (a wait), gets its own CPU time: unlike the
  // duration, it leaves out time spent waiting for a core, so a loaded
  // machine's timelines can still be weighed (tools/plot_timeline.py).
  void Record(TraceEvent event);
  std::vector<TraceEvent> Events() const;
  void Clear();

  // {"traceEvents": [...], "displayTimeUnit": "ms", "mcc": {"rank": R,
  // "clock_sync_us": T}} with a metadata event naming the process and each
  // track.
  absl::Status WriteChromeTrace(const std::string& path) const;
  std::string ToChromeTraceJson() const;

 private:
  mutable std::mutex mu_;
  std::atomic<bool> enabled_{false};
  std::atomic<int64_t> step_{-1};
  int rank_ = 0;
  int64_t clock_sync_us_ = -1;
  std::vector<std::pair<int, std::string>> track_names_;
  std::vector<TraceEvent> events_;
};

// Records [construction, destruction) as one event when the global
// recorder is enabled. Disabled, it allocates nothing: callers that build
// names or arguments guard that work with active().
class TraceScope {
 public:
  TraceScope(absl::string_view name, absl::string_view category, int track = 0);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
  bool active() const { return active_; }
  void set_name(std::string name) {
    if (active_) event_.name = std::move(name);
  }
  void AddArg(std::string key, std::string value);

 private:
  bool active_;
  TraceEvent event_;
};

}  // namespace observability
}  // namespace mcc

#endif  // OBSERVABILITY_TRACE_H_
