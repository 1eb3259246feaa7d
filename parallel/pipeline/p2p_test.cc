// The pipeline's transfers (PlanTransfers), simulated over every stage of every
// schedule as NCCL would run them: each stage's batches on one stream, one
// after the other; a batch finishes once each of its sends has met its
// receive in the peer's current batch; transfers between two stages match in
// posting order (no tags). Every schedule must finish, and each receive must
// get the message its action expects. The overlapped order the executor used
// to post (the next receive before the current send) must deadlock here.
#include "parallel/pipeline/p2p.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace mcc {
namespace pipeline {
namespace {

struct Op {
  bool send = false;
  int peer = 0;
  int action = 0;  // This stage's action whose result or input moves.
};
using Batch = std::vector<Op>;

// With split_sends each batch's sends are posted as a group of their own
// before its receives (as the executor posted ZB-V's over gloo before).
std::vector<Batch> BatchedPlan(const StageLayout& layout,
                               const std::vector<Action>& actions,
                               const std::vector<std::vector<Action>>& all,
                               bool split_sends = false) {
  std::vector<Batch> plan;
  for (const TransferBatch& t : PlanTransfers(layout, actions, &all)) {
    Batch b;
    for (int i : t.send_actions) {
      b.push_back({true, layout.Destination(actions[i]), i});
    }
    if (split_sends && !b.empty()) {
      plan.push_back(b);
      b.clear();
    }
    for (int i : t.recv_actions) {
      b.push_back({false, layout.Source(actions[i]), i});
    }
    if (!b.empty()) plan.push_back(b);
  }
  return plan;
}

// The order the executor used before: receive for action i + 1 posted before
// action i's result is sent, each transfer on its own.
std::vector<Batch> PrefetchPlan(const StageLayout& layout,
                                const std::vector<Action>& actions) {
  std::vector<Batch> plan;
  auto recv = [&](size_t i) {
    if (i < actions.size() && layout.Receives(actions[i])) {
      plan.push_back({{false, layout.Source(actions[i]), static_cast<int>(i)}});
    }
  };
  recv(0);
  for (size_t i = 0; i < actions.size(); ++i) {
    recv(i + 1);
    if (layout.Sends(actions[i])) {
      plan.push_back(
          {{true, layout.Destination(actions[i]), static_cast<int>(i)}});
    }
  }
  return plan;
}

// Runs the stages' plans; returns "" when all finish with every receive
// matched to the message it expects, else what went wrong.
// With async_sends (the executor's ZB-V over gloo: a batch's sends and
// receives posted as two works, and only the receives waited for before
// the unit) a stage waits only for its receives; its sends complete
// whenever the peer posts the matching receives.
std::string Simulate(int stages, int chunks, bool v_shape,
                     const std::vector<std::vector<Action>>& actions,
                     const std::vector<std::vector<Batch>>& plans,
                     bool async_sends = false) {
  // Position of each op on its channel (src -> dst), in posting order.
  struct Ref {
    int stage, batch, op;
  };
  std::map<std::pair<int, int>, std::vector<Ref>> sends, recvs;
  for (int s = 0; s < stages; ++s) {
    for (int b = 0; b < static_cast<int>(plans[s].size()); ++b) {
      for (int o = 0; o < static_cast<int>(plans[s][b].size()); ++o) {
        const Op& op = plans[s][b][o];
        if (op.send) {
          sends[{s, op.peer}].push_back({s, b, o});
        } else {
          recvs[{op.peer, s}].push_back({s, b, o});
        }
      }
    }
  }
  // Matches, and checks that each receive gets the message it expects.
  std::map<std::tuple<int, int, int>, Ref> match;
  for (auto& [channel, list] : sends) {
    const auto& other = recvs[channel];
    if (other.size() != list.size()) {
      return absl::StrCat(list.size(), " sends but ", other.size(),
                          " receives from stage ", channel.first, " to ",
                          channel.second);
    }
    for (size_t k = 0; k < list.size(); ++k) {
      const Ref& sr = list[k];
      const Ref& rr = other[k];
      const StageLayout from{stages, sr.stage, chunks, v_shape};
      const Action sent =
          actions[sr.stage][plans[sr.stage][sr.batch][sr.op].action];
      const Action wanted =
          actions[rr.stage][plans[rr.stage][rr.batch][rr.op].action];
      if (!(from.Consumer(sent) == wanted)) {
        return absl::StrCat("stage ", rr.stage, " receives for ",
                            ActionString(wanted), " what stage ", sr.stage,
                            "'s ", ActionString(sent), " sent");
      }
      match[{sr.stage, sr.batch, sr.op}] = rr;
      match[{rr.stage, rr.batch, rr.op}] = sr;
    }
  }
  for (auto& [channel, list] : recvs) {
    if (sends.count(channel) == 0 && !list.empty()) {
      return absl::StrCat("stage ", channel.second, " receives from stage ",
                          channel.first, ", which sends nothing");
    }
  }
  std::vector<int> current(stages, 0);
  std::vector<std::vector<std::vector<bool>>> done(stages);
  for (int s = 0; s < stages; ++s) {
    for (const Batch& b : plans[s]) done[s].emplace_back(b.size(), false);
  }
  // Posted: a stage has posted every batch up to its current one.
  auto posted = [&](const Ref& r) { return current[r.stage] >= r.batch; };
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      const int b = current[s];
      if (b >= static_cast<int>(plans[s].size())) continue;
      bool all = true;
      for (int o = 0; o < static_cast<int>(plans[s][b].size()); ++o) {
        if (done[s][b][o]) continue;
        const Ref& peer = match.at({s, b, o});
        if (async_sends ? posted(peer) : current[peer.stage] == peer.batch) {
          done[s][b][o] = true;
          done[peer.stage][peer.batch][peer.op] = true;
        } else {
          all = false;
        }
      }
      if (async_sends) {
        // With async sends only receives hold the stage up.
        all = true;
        for (int o = 0; async_sends && o < static_cast<int>(plans[s][b].size());
             ++o) {
          if (!plans[s][b][o].send && !done[s][b][o]) all = false;
        }
      }
      if (all) {
        ++current[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s) {
    if (current[s] < static_cast<int>(plans[s].size())) {
      const Op& op = plans[s][current[s]][0];
      return absl::StrCat("deadlock: stage ", s, " stuck at batch ", current[s],
                          " (", op.send ? "send of " : "recv for ",
                          ActionString(actions[s][op.action]), ")");
    }
  }
  for (int s = 0; s < stages; ++s) {
    for (int b = 0; b < static_cast<int>(plans[s].size()); ++b) {
      for (size_t o = 0; o < done[s][b].size(); ++o) {
        if (!done[s][b][o]) {
          return absl::StrCat("stage ", s, " batch ", b, " op ", o, " (",
                              ActionString(actions[s][plans[s][b][o].action]),
                              ") never met its peer");
        }
      }
    }
  }
  return "";
}

struct Config {
  ScheduleKind kind;
  int stages, chunks, microbatches;
  bool forward_only;
  std::string Name() const {
    return absl::StrCat(ScheduleName(kind), " P", stages, " V", chunks, " m",
                        microbatches, forward_only ? " forward-only" : "");
  }
};

std::vector<Config> Configs() {
  std::vector<Config> v;
  for (bool fo : {false, true}) {
    for (int p = 2; p <= 6; ++p) {
      for (int m = 1; m <= 10; ++m) {
        v.push_back({ScheduleKind::kOneFOneB, p, 1, m, fo});
        v.push_back({ScheduleKind::kZeroBubbleH1, p, 1, m, fo});
        v.push_back({ScheduleKind::kAllForwardAllBackward, p, 1, m, fo});
      }
      for (int c = 2; c <= 3; ++c) {
        for (int m = p; m <= 3 * p; m += p) {
          v.push_back({ScheduleKind::kInterleaved, p, c, m, fo});
        }
        if (fo) {
          for (int m = 1; m < 2 * p; ++m) {
            v.push_back({ScheduleKind::kInterleaved, p, c, m, true});
          }
        }
      }
      for (int m = 1; m <= 4 * p; ++m) {
        v.push_back({ScheduleKind::kZeroBubbleV, p, 2, m, fo});
      }
    }
  }
  return v;
}

std::string RunConfig(const Config& c, bool prefetch, bool async_sends = false,
                      bool split_sends = false) {
  std::vector<std::vector<Action>> actions(c.stages);
  std::vector<std::vector<Batch>> plans(c.stages);
  for (int s = 0; s < c.stages; ++s) {
    auto a = BuildSchedule(c.kind, c.stages, s, c.chunks, c.microbatches,
                           c.forward_only);
    if (!a.ok()) return a.status().ToString();
    actions[s] = *a;
  }
  for (int s = 0; s < c.stages; ++s) {
    const StageLayout layout{c.stages, s, c.chunks, IsVShaped(c.kind)};
    plans[s] = prefetch ? PrefetchPlan(layout, actions[s])
                        : BatchedPlan(layout, actions[s], actions, split_sends);
  }
  return Simulate(c.stages, c.chunks, IsVShaped(c.kind), actions, plans,
                  async_sends);
}

TEST(PipelineP2PTest, EveryScheduleFinishesAndMatchesWithoutTags) {
  // ZB-V included: its transfers follow one global order (p2p.h).
  int checked = 0, v_shaped = 0;
  for (const Config& c : Configs()) {
    EXPECT_EQ(RunConfig(c, /*prefetch=*/false), "") << c.Name();
    ++checked;
    v_shaped += IsVShaped(c.kind);
  }
  EXPECT_GT(checked, 300);
  EXPECT_GT(v_shaped, 100);
}

TEST(PipelineP2PTest, EveryScheduleFinishesWithSendsThatDoNotBlock) {
  // As gloo and the executor's overlapped p2p run: every schedule, ZB-V
  // included, whose channels carry two streams in different orders.
  int checked = 0;
  for (const Config& c : Configs()) {
    EXPECT_EQ(RunConfig(c, /*prefetch=*/false, /*async_sends=*/true), "")
        << c.Name();
    checked += IsVShaped(c.kind);
  }
  EXPECT_GT(checked, 100);
}

TEST(PipelineP2PTest, ZeroBubbleVFinishesWithSendsPostedBeforeReceives) {
  // The executor posts a ZB-V batch's sends as a work of their own, then
  // its receives: in the global order a batch's send (of the action just
  // run) comes before its receives, so NCCL's stream order still finishes.
  int checked = 0;
  for (const Config& c : Configs()) {
    if (!IsVShaped(c.kind)) continue;
    EXPECT_EQ(RunConfig(c, /*prefetch=*/false, /*async_sends=*/false,
                        /*split_sends=*/true),
              "")
        << c.Name();
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

TEST(PipelineP2PTest, ZeroBubbleVReceivesBeforeTheAction) {
  // The simulation above does not run the actions: check here that each
  // input is received in a batch posted before its action, exactly once,
  // and each result sent right after its own.
  for (const Config& c : Configs()) {
    if (!IsVShaped(c.kind)) continue;
    std::vector<std::vector<Action>> all(c.stages);
    for (int s = 0; s < c.stages; ++s) {
      all[s] = *BuildSchedule(c.kind, c.stages, s, c.chunks, c.microbatches,
                              c.forward_only);
    }
    for (int s = 0; s < c.stages; ++s) {
      const StageLayout layout{c.stages, s, c.chunks, true};
      std::vector<int> received(all[s].size(), 0);
      for (const TransferBatch& b : PlanTransfers(layout, all[s], &all)) {
        for (int i : b.recv_actions) {
          EXPECT_LE(b.first_action, i) << c.Name() << " stage " << s;
          ++received[i];
        }
        for (int i : b.send_actions) EXPECT_EQ(i + 1, b.first_action);
      }
      for (size_t i = 0; i < all[s].size(); ++i) {
        EXPECT_EQ(received[i], layout.Receives(all[s][i]) ? 1 : 0)
            << c.Name() << " stage " << s << " action " << i;
      }
    }
  }
}

TEST(PipelineP2PTest, ReceivingBeforeSendingDeadlocksOverNccl) {
  // The simulator can fail: the old overlapped order posts stage 0's receive
  // of B0 before its send of F1, which stage 1 needs before it sends B0.
  EXPECT_NE(RunConfig({ScheduleKind::kOneFOneB, 2, 1, 4, false}, true)
                .find("deadlock"),
            std::string::npos);
  EXPECT_NE(RunConfig({ScheduleKind::kOneFOneB, 4, 1, 8, false}, true)
                .find("deadlock"),
            std::string::npos);
}

TEST(PipelineP2PTest, TwoStagesShareOnePeer) {
  // With two stages the previous and the next stage are one peer: forward
  // activations and backward gradients of both chunks share each channel,
  // and still arrive in the order they are consumed.
  const StageLayout s0{2, 0, 2};
  EXPECT_EQ(s0.Next(), s0.Prev());
  EXPECT_EQ(RunConfig({ScheduleKind::kInterleaved, 2, 2, 4, false}, false), "");
  EXPECT_EQ(s0.Consumer({Action::kBackward, 3, 1}),
            (Action{Action::kBackward, 3, 0}));
  const StageLayout s1{2, 1, 2};
  EXPECT_EQ(s1.Consumer({Action::kForward, 3, 0}),
            (Action{Action::kForward, 3, 1}));
  EXPECT_FALSE(s1.Sends({Action::kForward, 0, 1}));  // The loss chunk.
  EXPECT_FALSE(s0.Sends({Action::kBackward, 0, 0}));
}

}  // namespace
}  // namespace pipeline
}  // namespace mcc

namespace mcc {
namespace pipeline {
namespace {

TEST(PipelineP2PTest, VShapeTurnsOnTheLastStage) {
  // ZB-V at PP 3: chunk 0 runs down stages 0, 1, 2, chunk 1 back up 2, 1, 0.
  const StageLayout last{3, 2, 2, true};
  EXPECT_FALSE(last.Sends({Action::kForward, 0, 0}));
  EXPECT_TRUE(last.HandsOffLocally({Action::kForward, 0, 0}));
  EXPECT_EQ(last.LocalConsumer({Action::kForward, 5, 0}),
            (Action{Action::kForward, 5, 1}));
  EXPECT_TRUE(last.TakesLocalInput({Action::kForward, 0, 1}));
  EXPECT_FALSE(last.Receives({Action::kForward, 0, 1}));
  EXPECT_EQ(last.Destination({Action::kForward, 0, 1}), 1);
  EXPECT_TRUE(last.HandsOffLocally({Action::kBackward, 2, 1}));
  EXPECT_EQ(last.LocalConsumer({Action::kBackward, 2, 1}),
            (Action{Action::kBackward, 2, 0}));
  EXPECT_TRUE(last.TakesLocalInput({Action::kBackward, 2, 0}));
  EXPECT_EQ(last.Destination({Action::kBackward, 2, 0}), 1);
  const StageLayout first{3, 0, 2, true};
  EXPECT_TRUE(first.TakesBatchInput(0));
  EXPECT_TRUE(first.ComputesLoss(1));
  EXPECT_FALSE(first.Sends({Action::kForward, 0, 1}));
  EXPECT_FALSE(first.Receives({Action::kBackward, 0, 1}));
  EXPECT_TRUE(first.Sends({Action::kBackward, 0, 1}));
  EXPECT_EQ(first.Destination({Action::kBackward, 0, 1}), 1);
  EXPECT_FALSE(first.HandsOffLocally({Action::kForward, 0, 0}));
  const StageLayout middle{3, 1, 2, true};
  EXPECT_EQ(middle.Consumer({Action::kForward, 4, 1}),
            (Action{Action::kForward, 4, 1}));
  EXPECT_EQ(middle.Destination({Action::kForward, 4, 1}), 0);
  EXPECT_EQ(middle.Source({Action::kForward, 4, 1}), 2);
}

}  // namespace
}  // namespace pipeline
}  // namespace mcc
