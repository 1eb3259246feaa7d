#include "observability/trace.h"

#include <chrono>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "observability/trace_merge.h"

namespace mcc {
namespace observability {
namespace {

TraceEvent Event(std::string name, int64_t start, int64_t dur, int track) {
  TraceEvent e;
  e.name = std::move(name);
  e.category = "compute";
  e.start_us = start;
  e.duration_us = dur;
  e.track = track;
  return e;
}

TEST(TraceRecorderTest, DisabledRecordsNothing) {
  TraceRecorder r;
  r.Record(Event("forward", 1, 2, 0));
  EXPECT_TRUE(r.Events().empty());
}

TEST(TraceRecorderTest, WritesCompleteEventsWithRankAndTrackNames) {
  TraceRecorder r;
  r.Enable(3);
  r.NameTrack(1, "comm");
  r.MarkClockSync();
  TraceEvent e = Event("all_reduce #5", 100, 40, 1);
  e.args.emplace_back("bytes", "4096");
  r.Record(e);
  const nlohmann::json doc = nlohmann::json::parse(r.ToChromeTraceJson());
  EXPECT_EQ(doc["mcc"]["rank"], 3);
  EXPECT_GT(doc["mcc"]["clock_sync_us"].get<int64_t>(), 0);
  int complete = 0, thread_names = 0;
  for (const auto& ev : doc["traceEvents"]) {
    EXPECT_EQ(ev["pid"], 3);
    if (ev["ph"] == "X") {
      ++complete;
      EXPECT_EQ(ev["name"], "all_reduce #5");
      EXPECT_EQ(ev["ts"], 100);
      EXPECT_EQ(ev["dur"], 40);
      EXPECT_EQ(ev["tid"], 1);
      EXPECT_EQ(ev["args"]["bytes"], "4096");
    }
    if (ev["name"] == "thread_name") {
      ++thread_names;
      EXPECT_EQ(ev["args"]["name"], "comm");
    }
  }
  EXPECT_EQ(complete, 1);
  EXPECT_EQ(thread_names, 1);
}

std::string RankTrace(int rank, int64_t sync, std::vector<TraceEvent> evs) {
  nlohmann::json events = nlohmann::json::array();
  for (const TraceEvent& e : evs) {
    events.push_back({{"name", e.name},
                      {"ph", "X"},
                      {"ts", e.start_us},
                      {"dur", e.duration_us},
                      {"pid", rank},
                      {"tid", 0}});
  }
  return nlohmann::json{{"traceEvents", events},
                        {"mcc", {{"rank", rank}, {"clock_sync_us", sync}}}}
      .dump();
}

TEST(TraceMergeTest, AlignsRanksOnTheirClockSyncMarks) {
  // Rank 1's clock reads 5000 us more than rank 0's at the same moment.
  const std::string r0 = RankTrace(0, 1000, {Event("fwd", 1200, 10, 0)});
  const std::string r1 = RankTrace(1, 6000, {Event("fwd", 6300, 10, 0)});
  absl::StatusOr<std::string> merged = MergeChromeTraces({r0, r1}, {"a", "b"});
  ASSERT_TRUE(merged.ok()) << merged.status();
  const nlohmann::json doc = nlohmann::json::parse(*merged);
  std::vector<std::pair<int, int64_t>> starts;
  for (const auto& ev : doc["traceEvents"]) {
    starts.emplace_back(ev["pid"].get<int>(), ev["ts"].get<int64_t>());
  }
  // Rank 0 at 200 us after sync, rank 1 at 300 us: shifted to start at 0.
  EXPECT_EQ(starts, (std::vector<std::pair<int, int64_t>>{{0, 0}, {1, 100}}));
}

TEST(TraceMergeTest, NamesTheTraceWithoutAMark) {
  const std::string bad =
      nlohmann::json{{"traceEvents", nlohmann::json::array()}}.dump();
  absl::StatusOr<std::string> merged = MergeChromeTraces(
      {RankTrace(0, 1, {}), bad}, {"rank0.json", "rank1.json"});
  ASSERT_FALSE(merged.ok());
  EXPECT_NE(merged.status().message().find("rank1.json"), std::string::npos);
  EXPECT_FALSE(MergeChromeTraces({"not json"}, {"x.json"}).ok());
}

// Members of the wrong type threw nlohmann's type_error out of value(),
// aborting merge_traces.
TEST(TraceMergeTest, WrongTypedFieldsNameTheFileAndField) {
  const std::string good = RankTrace(0, 1000, {Event("fwd", 1200, 10, 0)});
  auto with = [](nlohmann::json doc) { return doc.dump(); };
  const nlohmann::json event = nlohmann::json::parse(good)["traceEvents"][0];
  nlohmann::json bad_ts = event, bad_ph = event;
  bad_ts["ts"] = "1200";
  bad_ph["ph"] = 1;
  const nlohmann::json mark = {{"clock_sync_us", 1000}};
  struct Case {
    std::string trace;
    std::string want;
  } cases[] = {
      {with({{"traceEvents", nlohmann::json::array()}, {"mcc", 5}}),
       "bad.json: mcc: expected a JSON object"},
      {with({{"traceEvents", nlohmann::json::array()},
             {"mcc", {{"clock_sync_us", "1000"}}}}),
       "bad.json: mcc: \"clock_sync_us\" must be an integer"},
      {with({{"traceEvents", {event, 3}}, {"mcc", mark}}),
       "bad.json: traceEvents[1]: expected a JSON object"},
      {with({{"traceEvents", {bad_ts}}, {"mcc", mark}}),
       "bad.json: traceEvents[0]: \"ts\" must be an integer"},
      {with({{"traceEvents", {bad_ph}}, {"mcc", mark}}),
       "bad.json: traceEvents[0]: \"ph\" must be a string"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::string> merged =
        MergeChromeTraces({good, c.trace}, {"good.json", "bad.json"});
    ASSERT_FALSE(merged.ok()) << c.trace;
    EXPECT_NE(merged.status().message().find(c.want), std::string::npos)
        << merged.status();
  }
  // Times whose shifted sum overflows int64.
  nlohmann::json far = event;
  far["ts"] = std::numeric_limits<int64_t>::min();
  absl::StatusOr<std::string> merged = MergeChromeTraces(
      {with({{"traceEvents", {far}}, {"mcc", {{"clock_sync_us", 0}}}}),
       RankTrace(1, 1000, {Event("fwd", 1200, 10, 0)})},
      {"a.json", "b.json"});
  ASSERT_FALSE(merged.ok());
  EXPECT_NE(merged.status().message().find("out of range"), std::string::npos)
      << merged.status();
}

// cpu_us is the recording thread's CPU time since its previous record:
// a busy stretch counts, a sleep does not, the thread's first record has
// none.
TEST(TraceRecorderTest, CpuTimeSinceTheThreadsPreviousRecord) {
  TraceRecorder r;
  r.Enable(0);
  std::thread([&] {
    r.Record(Event("first", 0, 1, 0));
    // Spin until this thread has had 20 ms of CPU, however loaded the
    // machine.
    auto thread_cpu_us = [] {
      timespec ts;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
    };
    const long long spin_until = thread_cpu_us() + 20000;
    volatile double x = 0;
    while (thread_cpu_us() < spin_until) x = x + 1;
    r.Record(Event("busy", 1, 1, 0));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    r.Record(Event("slept", 2, 1, 0));
  }).join();
  std::map<std::string, std::map<std::string, std::string>> args;
  for (const TraceEvent& e : r.Events()) {
    args[e.name] = {e.args.begin(), e.args.end()};
  }
  EXPECT_EQ(args["first"].count("cpu_us"), 0u);
  ASSERT_EQ(args["busy"].count("cpu_us"), 1u);
  EXPECT_GE(std::stoll(args["busy"]["cpu_us"]), 20000);
  ASSERT_EQ(args["slept"].count("cpu_us"), 1u);
  EXPECT_LT(std::stoll(args["slept"]["cpu_us"]), 10000);
}

}  // namespace
}  // namespace observability
}  // namespace mcc
