#include "observability/trace.h"

#include <time.h>

#include <chrono>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace observability {

TraceRecorder& TraceRecorder::Global() {
  static TraceRecorder* recorder = new TraceRecorder;
  return *recorder;
}

void TraceRecorder::Enable(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  enabled_ = true;
  rank_ = rank;
}

void TraceRecorder::Disable() {
  std::lock_guard<std::mutex> lock(mu_);
  enabled_ = false;
}

bool TraceRecorder::enabled() const {
  return enabled_.load(std::memory_order_relaxed);
}

void TraceRecorder::NameTrack(int track, std::string name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [t, n] : track_names_) {
    if (t == track) {
      n = std::move(name);
      return;
    }
  }
  track_names_.emplace_back(track, std::move(name));
}

int64_t TraceRecorder::NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t TraceRecorder::ToMicros(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             t.time_since_epoch())
      .count();
}

void TraceRecorder::MarkClockSync() {
  const int64_t now = NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  clock_sync_us_ = now;
}

namespace {

// The calling thread's CPU clock, microseconds (-1 if unreadable).
int64_t ThreadCpuMicros() {
  timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return -1;
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

}  // namespace

void TraceRecorder::Record(TraceEvent event) {
  if (!enabled()) return;
  const int64_t step = this->step();
  if (step >= 0) event.args.emplace_back("step", absl::StrCat(step));
  thread_local int64_t last_cpu_us = -1;
  const int64_t cpu_us = ThreadCpuMicros();
  if (last_cpu_us >= 0 && cpu_us >= 0) {
    event.args.emplace_back("cpu_us", absl::StrCat(cpu_us - last_cpu_us));
  }
  last_cpu_us = cpu_us;
  std::lock_guard<std::mutex> lock(mu_);
  if (enabled_) events_.push_back(std::move(event));
}

std::vector<TraceEvent> TraceRecorder::Events() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_;
}

void TraceRecorder::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
}

std::string TraceRecorder::ToChromeTraceJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"tid", 0},
                    {"args", {{"name", absl::StrCat("rank ", rank_)}}}});
  for (const auto& [track, name] : track_names_) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank_},
                      {"tid", track},
                      {"args", {{"name", name}}}});
  }
  for (const TraceEvent& e : events_) {
    nlohmann::json args = nlohmann::json::object();
    for (const auto& [k, v] : e.args) args[k] = v;
    events.push_back({{"name", e.name},
                      {"cat", e.category},
                      {"ph", "X"},
                      {"ts", e.start_us},
                      {"dur", e.duration_us},
                      {"pid", rank_},
                      {"tid", e.track},
                      {"args", args}});
  }
  nlohmann::json doc = {
      {"traceEvents", events},
      {"displayTimeUnit", "ms"},
      {"mcc", {{"rank", rank_}, {"clock_sync_us", clock_sync_us_}}}};
  return doc.dump();
}

absl::Status TraceRecorder::WriteChromeTrace(const std::string& path) const {
  const std::string text = ToChromeTraceJson();
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      return absl::UnavailableError(
          absl::StrCat("writing the trace ", tmp, " failed"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("renaming the trace ", tmp, " to ", path, " failed"));
  }
  return absl::OkStatus();
}

TraceScope::TraceScope(absl::string_view name, absl::string_view category,
                       int track)
    : active_(TraceRecorder::Global().enabled()) {
  if (!active_) return;
  event_.name = std::string(name);
  event_.category = std::string(category);
  event_.track = track;
  event_.start_us = TraceRecorder::NowMicros();
}

TraceScope::~TraceScope() {
  if (!active_) return;
  event_.duration_us = TraceRecorder::NowMicros() - event_.start_us;
  TraceRecorder::Global().Record(std::move(event_));
}

void TraceScope::AddArg(std::string key, std::string value) {
  if (active_) event_.args.emplace_back(std::move(key), std::move(value));
}

}  // namespace observability
}  // namespace mcc
