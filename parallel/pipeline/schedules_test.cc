// Every schedule is run on a simulated pipeline: each stage takes its
// actions in order, an action starts once its input has been produced by
// the neighbouring stage (sends never block, as the executor's), and the
// simulation must finish (no deadlock) with every micro-batch's forward and
// backward done once per chunk on every stage.
#include "parallel/pipeline/schedules.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "gtest/gtest.h"

namespace mcc {
namespace pipeline {
namespace {

struct Simulation {
  double makespan = 0;
  std::vector<double> busy;        // Per stage.
  std::vector<int> max_in_flight;  // Per stage.
};

// Forward takes 1/chunks, backward 2/chunks time units.
Simulation Simulate(ScheduleKind kind, int p, int v, int m) {
  std::vector<std::vector<Action>> plan(p);
  for (int s = 0; s < p; ++s) {
    auto a = BuildSchedule(kind, p, s, v, m);
    EXPECT_TRUE(a.ok()) << a.status();
    plan[s] = *a;
    // Each (kind, chunk) runs micro-batches in increasing order, so
    // transfers of one tag match first in, first out.
    std::map<std::pair<int, int>, int> last;
    int count = 0;
    for (const Action& x : plan[s]) {
      auto key = std::make_pair(static_cast<int>(x.kind), x.chunk);
      auto it = last.find(key);
      if (it != last.end()) {
        EXPECT_EQ(x.microbatch, it->second + 1) << ActionString(x);
      } else {
        EXPECT_EQ(x.microbatch, 0) << ActionString(x);
      }
      last[key] = x.microbatch;
      ++count;
    }
    EXPECT_EQ(count, 2 * m * v) << "stage " << s;
  }
  // done[(stage, kind, mb, chunk)] = finish time.
  std::map<std::tuple<int, int, int, int>, double> done;
  auto dependency = [&](int s, const Action& a) {
    if (a.kind == Action::kForward) {
      if (s > 0) return std::make_tuple(s - 1, 0, a.microbatch, a.chunk);
      if (a.chunk > 0)
        return std::make_tuple(p - 1, 0, a.microbatch, a.chunk - 1);
      return std::make_tuple(-1, 0, 0, 0);
    }
    if (s < p - 1) return std::make_tuple(s + 1, 1, a.microbatch, a.chunk);
    if (a.chunk < v - 1)
      return std::make_tuple(0, 1, a.microbatch, a.chunk + 1);
    return std::make_tuple(s, 0, a.microbatch, a.chunk);  // Its own forward.
  };
  Simulation sim;
  sim.busy.assign(p, 0);
  sim.max_in_flight.assign(p, 0);
  std::vector<size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<int> in_flight(p, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      while (next[s] < plan[s].size()) {
        const Action& a = plan[s][next[s]];
        auto dep = dependency(s, a);
        double ready = 0;
        if (std::get<0>(dep) >= 0) {
          auto it = done.find(dep);
          if (it == done.end()) break;
          ready = it->second;
        }
        const double cost = (a.kind == Action::kForward ? 1.0 : 2.0) / v;
        clock[s] = std::max(clock[s], ready) + cost;
        sim.busy[s] += cost;
        done[{s, static_cast<int>(a.kind), a.microbatch, a.chunk}] = clock[s];
        in_flight[s] += a.kind == Action::kForward ? 1 : -1;
        sim.max_in_flight[s] = std::max(sim.max_in_flight[s], in_flight[s]);
        ++next[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(next[s], plan[s].size())
        << ScheduleName(kind) << ": stage " << s << " deadlocked at "
        << ActionString(plan[s][std::min(next[s], plan[s].size() - 1)]);
    sim.makespan = std::max(sim.makespan, clock[s]);
  }
  return sim;
}

TEST(SchedulesTest, OneFOneBRunsAndMatchesTheBubbleFormula) {
  for (int p : {2, 4}) {
    for (int m : {1, 2, 4, 8}) {
      Simulation sim = Simulate(ScheduleKind::kOneFOneB, p, 1, m);
      const double idle = 1.0 - sim.busy[0] / sim.makespan;
      EXPECT_NEAR(idle, TheoreticalBubble(ScheduleKind::kOneFOneB, p, 1, m),
                  1e-9)
          << "P " << p << " m " << m;
      // The first stage never holds more than P micro-batches.
      EXPECT_EQ(sim.max_in_flight[0], std::min(p, m)) << p << " " << m;
      for (int s = 0; s < p; ++s) EXPECT_LE(sim.max_in_flight[s], p - s);
    }
  }
}

TEST(SchedulesTest, AllForwardAllBackwardHoldsEveryMicroBatch) {
  Simulation sim = Simulate(ScheduleKind::kAllForwardAllBackward, 4, 1, 8);
  EXPECT_EQ(sim.max_in_flight[0], 8);
}

TEST(SchedulesTest, NoPipeliningHoldsOneMicroBatch) {
  Simulation sim = Simulate(ScheduleKind::kNoPipelining, 1, 1, 5);
  EXPECT_EQ(sim.max_in_flight[0], 1);
  EXPECT_DOUBLE_EQ(sim.makespan, 15.0);
}

TEST(SchedulesTest, InterleavedRunsAndShrinksTheBubble) {
  for (int p : {2, 4}) {
    for (int v : {2, 3}) {
      for (int m : {p, 2 * p, 4 * p}) {
        Simulation inter = Simulate(ScheduleKind::kInterleaved, p, v, m);
        Simulation plain = Simulate(ScheduleKind::kOneFOneB, p, 1, m);
        EXPECT_LT(inter.makespan, plain.makespan)
            << "P " << p << " V " << v << " m " << m;
      }
    }
  }
}

TEST(SchedulesTest, ForwardOnlyIsAllForwards) {
  auto a = BuildSchedule(ScheduleKind::kInterleaved, 2, 1, 2, 4, true);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->size(), 8u);
  for (const Action& x : *a) EXPECT_EQ(x.kind, Action::kForward);
  EXPECT_EQ((*a)[2], (Action{Action::kForward, 0, 1}));
  // Evaluation may use a micro-batch count the training schedule cannot.
  a = BuildSchedule(ScheduleKind::kInterleaved, 2, 0, 2, 3, true);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->size(), 6u);
  EXPECT_EQ((*a)[4], (Action{Action::kForward, 2, 0}));
  EXPECT_EQ((*a)[5], (Action{Action::kForward, 2, 1}));
}

TEST(SchedulesTest, RejectsWhatItCannotRun) {
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kInterleaved, 4, 0, 2, 6).ok());
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kOneFOneB, 4, 0, 2, 8).ok());
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kNoPipelining, 2, 0, 1, 8).ok());
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kOneFOneB, 4, 4, 1, 8).ok());
}

}  // namespace
}  // namespace pipeline
}  // namespace mcc
