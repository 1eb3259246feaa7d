// CommTraceObserver: its events and tracks from hand-made calls, and from
// real gloo collectives and p2p calls between two processes.
#include "observability/comm_trace.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/comm/call_observer.h"
#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace observability {
namespace {

std::map<std::string, std::string> Args(const TraceEvent& e) {
  return std::map<std::string, std::string>(e.args.begin(), e.args.end());
}

TEST(CommTraceObserverTest, NamesGroupBytesAndSequence) {
  TraceRecorder recorder;
  recorder.Enable(0);
  recorder.SetStep(4);
  CommTraceObserver observer(&recorder);
  const std::string group = "world/sub3[0,2]", op = "AllReduce",
                    sig = "AllReduce(sum)";
  observer.LabelGroup(group, "dp");
  observer.LabelGroup(group, "model");  // The first label stays.
  comm::CallObserver::Done done =
      observer.OnIssue({group, op, sig, 7, -1, -1, 4096});
  ASSERT_TRUE(done);
  done(absl::OkStatus());
  const std::vector<TraceEvent> events = recorder.Events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].name, "AllReduce #7");
  EXPECT_EQ(events[0].category, "comm");
  const auto args = Args(events[0]);
  EXPECT_EQ(args.at("group"), "world/sub3[0,2]");
  EXPECT_EQ(args.at("role"), "dp");
  const nlohmann::json doc =
      nlohmann::json::parse(recorder.ToChromeTraceJson());
  bool named = false;
  for (const auto& e : doc["traceEvents"]) {
    named |= e["ph"] == "M" && e["tid"] == events[0].track &&
             e["args"]["name"] == "comm dp (world/sub3[0,2])";
  }
  EXPECT_TRUE(named) << doc.dump();
  EXPECT_EQ(args.at("bytes"), "4096");
  EXPECT_EQ(args.at("seq"), "7");
  EXPECT_EQ(args.at("step"), "4");
}

TEST(CommTraceObserverTest, OverlappingCallsGoToSeparateTracks) {
  TraceRecorder recorder;
  recorder.Enable(0);
  CommTraceObserver observer(&recorder, 20);
  const std::string group = "pp", send = "Send", recv = "Recv", sig = "s";
  // A send and a receive in flight together, then a third call after both.
  auto a = observer.OnIssue({group, send, sig, -1, 0, 1, 8});
  auto b = observer.OnIssue({group, recv, sig, -1, 1, 1, 8});
  b(absl::OkStatus());
  a(absl::OkStatus());
  auto c = observer.OnIssue({group, send, sig, -1, 2, 1, 8});
  c(absl::OkStatus());
  std::vector<TraceEvent> events = recorder.Events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].name, "Recv #1 from rank 1");
  EXPECT_EQ(events[1].name, "Send #0 to rank 1");
  EXPECT_EQ(events[0].category, "p2p");
  EXPECT_NE(events[0].track, events[1].track);
  // No two events of one track overlap.
  for (size_t i = 0; i < events.size(); ++i) {
    for (size_t j = i + 1; j < events.size(); ++j) {
      if (events[i].track != events[j].track) continue;
      const bool disjoint =
          events[i].start_us + events[i].duration_us <= events[j].start_us ||
          events[j].start_us + events[j].duration_us <= events[i].start_us;
      EXPECT_TRUE(disjoint) << events[i].name << " and " << events[j].name;
    }
  }
  EXPECT_GE(events[0].track, 20);
}

TEST(CommTraceObserverTest, DisabledRecorderObservesNothing) {
  TraceRecorder recorder;
  CommTraceObserver observer(&recorder);
  const std::string g = "world", op = "Barrier", sig = "Barrier()";
  EXPECT_FALSE(observer.OnIssue({g, op, sig, 0, -1, -1, 0}));
}

// Two ranks: an all-reduce and a send/receive observed, then the observer
// removed and one more all-reduce that must not be.
MCC_WORKER(observed_calls) {
  comm::GroupOptions options;
  options.timeout = absl::Seconds(30);
  absl::StatusOr<comm::World> world = comm::InitWorldFromEnvironment(options);
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 10);
  }
  comm::ProcessGroup& pg = *world->group;
  TraceRecorder& recorder = TraceRecorder::Global();
  recorder.Enable(pg.rank());
  CommTraceObserver observer(&recorder);
  comm::SetCallObserver(&observer);
  Tensor t = Tensor::Zeros({16}, DType::kFloat32);
  if (!pg.AllReduceSync(&t, comm::ReduceOp::kSum).ok()) return 11;
  Tensor p = Tensor::Zeros({8}, DType::kFloat32);
  absl::Status s = pg.rank() == 0 ? pg.SendSync(p, 1) : pg.RecvSync(&p, 0);
  if (!s.ok()) return 12;
  comm::SetCallObserver(nullptr);
  if (!pg.AllReduceSync(&t, comm::ReduceOp::kSum).ok()) return 13;
  // Recorded as each call is seen finished: ordered by issue here.
  std::vector<TraceEvent> events = recorder.Events();
  std::sort(events.begin(), events.end(),
            [](const TraceEvent& a, const TraceEvent& b) {
              return a.start_us < b.start_us;
            });
  if (events.size() != 2) {
    std::fprintf(stderr, "%zu events\n", events.size());
    return 14;
  }
  const auto all_reduce = Args(events[0]);
  if (events[0].name != "AllReduce #0" || all_reduce.at("group") != "world" ||
      all_reduce.at("bytes") != "64" || all_reduce.at("seq") != "0") {
    std::fprintf(stderr, "all-reduce event: %s\n", events[0].name.c_str());
    return 15;
  }
  const std::string want =
      pg.rank() == 0 ? "Send #0 to rank 1" : "Recv #0 from rank 0";
  if (events[1].name != want || Args(events[1]).at("bytes") != "32") {
    std::fprintf(stderr, "p2p event: %s\n", events[1].name.c_str());
    return 16;
  }
  return 0;
}

TEST(CommTraceObserverTest, RecordsRealCallsOnlyWhileInstalled) {
  std::vector<comm::testing::WorkerResult> results =
      comm::testing::RunWorkers(2, "observed_calls", absl::Seconds(60));
  for (const auto& w : results) {
    EXPECT_EQ(w.exit_code, 0) << comm::testing::Describe(results);
  }
}

}  // namespace
}  // namespace observability
}  // namespace mcc
