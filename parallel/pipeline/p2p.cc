#include "parallel/pipeline/p2p.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace mcc {
namespace pipeline {

int StageLayout::NeighbourAt(int chunk, int step) const {
  const int v = virtual_stage(chunk) + step;
  if (v < 0 || v >= stages * chunks) return -1;
  int s = 0, c = 0;
  StageAndChunkOf(stages, v, v_shape, &s, &c);
  return s;
}

bool StageLayout::TakesBatchInput(int chunk) const {
  return virtual_stage(chunk) == 0;
}

bool StageLayout::ComputesLoss(int chunk) const {
  return virtual_stage(chunk) == stages * chunks - 1;
}

bool StageLayout::Receives(const Action& a) const {
  if (stages <= 1 || a.kind == Action::kWeight) return false;
  const int from = NeighbourAt(a.chunk, a.kind == Action::kForward ? -1 : 1);
  return from >= 0 && from != stage;
}

int StageLayout::Source(const Action& a) const {
  return NeighbourAt(a.chunk, a.kind == Action::kForward ? -1 : 1);
}

bool StageLayout::Sends(const Action& a) const {
  if (stages <= 1 || a.kind == Action::kWeight) return false;
  const int to = Destination(a);
  return to >= 0 && to != stage;
}

int StageLayout::Destination(const Action& a) const {
  return NeighbourAt(a.chunk, a.kind == Action::kForward ? 1 : -1);
}

Action StageLayout::Consumer(const Action& a) const {
  Action c = a;
  const int v = virtual_stage(a.chunk) + (a.kind == Action::kForward ? 1 : -1);
  int s = 0;
  StageAndChunkOf(stages, v, v_shape, &s, &c.chunk);
  return c;
}

bool StageLayout::HandsOffLocally(const Action& a) const {
  return stages > 1 && a.kind != Action::kWeight && Destination(a) == stage;
}

Action StageLayout::LocalConsumer(const Action& a) const { return Consumer(a); }

bool StageLayout::TakesLocalInput(const Action& a) const {
  return stages > 1 && a.kind != Action::kWeight && Source(a) == stage;
}

namespace {

// ZB-V's transfers (see PlanTransfers): every stage runs the same
// unit-time simulation of all stages' orders. In rounds, each stage runs
// its next action once its input has been sent; a result is sent right
// after the action producing it. That lists every action and transfer in
// one global order, and each stage posts its transfers in that order: the
// ones between two of its actions make the batch before the second.
void PlanVShapedInGlobalOrder(
    const StageLayout& layout,
    const std::vector<std::vector<Action>>& stage_actions,
    std::vector<TransferBatch>* plan) {
  const int stages = layout.stages;
  // Per stage, the index of each action, to find a transfer's consumer.
  std::vector<std::map<std::tuple<int, int, int>, int>> index(stages);
  for (int s = 0; s < stages; ++s) {
    for (size_t i = 0; i < stage_actions[s].size(); ++i) {
      const Action& a = stage_actions[s][i];
      index[s][{a.kind, a.chunk, a.microbatch}] = static_cast<int>(i);
    }
  }
  std::vector<StageLayout> layouts;
  for (int s = 0; s < stages; ++s) {
    layouts.push_back({stages, s, layout.chunks, true});
  }
  // Whether each stage's actions have run, and where each runs next.
  std::vector<std::vector<bool>> ran(stages);
  for (int s = 0; s < stages; ++s) ran[s].assign(stage_actions[s].size(), 0);
  std::vector<int> next(stages, 0);
  // A transfer to this stage goes in the batch before its next action at
  // the time it is sent.
  const int me = layout.stage;
  std::vector<bool> planned(stage_actions[me].size(), false);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      if (next[s] >= static_cast<int>(stage_actions[s].size())) continue;
      const Action& a = stage_actions[s][next[s]];
      if (layouts[s].Receives(a)) {
        const int from = layouts[s].Source(a);
        // The sender's action whose consumer `a` is.
        Action sent = a;
        int unused = 0;
        const int v = VirtualStage(stages, s, a.chunk, true) +
                      (a.kind == Action::kForward ? -1 : 1);
        StageAndChunkOf(stages, v, true, &unused, &sent.chunk);
        auto it = index[from].find({sent.kind, sent.chunk, sent.microbatch});
        if (it == index[from].end() || !ran[from][it->second]) continue;
      }
      ran[s][next[s]++] = true;
      progress = true;
      // This stage's own sends go in the batch after the action
      // (PlanTransfers).
      if (s != me && layouts[s].Sends(a) && layouts[s].Destination(a) == me) {
        const Action wanted = layouts[s].Consumer(a);
        const int consumer =
            index[me].at({wanted.kind, wanted.chunk, wanted.microbatch});
        (*plan)[next[me]].recv_actions.push_back(consumer);
        planned[consumer] = true;
      }
    }
  }
  // A stall means the orders cannot run together (CheckSchedule refuses
  // such tables first); the rest are received just before their action.
  for (int i = 0; i < static_cast<int>(stage_actions[me].size()); ++i) {
    if (!planned[i] && layout.Receives(stage_actions[me][i])) {
      (*plan)[i].recv_actions.push_back(i);
    }
  }
}

}  // namespace

std::vector<TransferBatch> PlanTransfers(
    const StageLayout& layout, const std::vector<Action>& actions,
    const std::vector<std::vector<Action>>* stage_actions) {
  const int n = static_cast<int>(actions.size());
  // Pairs only in a steady state: not when every forward precedes every
  // backward (the interleaved schedule with as many micro-batches as
  // stages, and evaluation).
  bool steady = false;
  for (int i = 0; i + 1 < n; ++i) {
    steady |= actions[i].kind == Action::kBackward &&
              actions[i + 1].kind == Action::kForward;
  }
  std::vector<std::pair<int, int>> units;
  for (int i = 0; i < n;) {
    // ZB-V: every action is a unit, so a batch may sit between any two.
    const bool pair = layout.chunks > 1 && steady && !layout.v_shape &&
                      i + 1 < n && actions[i].kind == Action::kForward &&
                      actions[i + 1].kind == Action::kBackward;
    units.emplace_back(i, pair ? i + 2 : i + 1);
    i = units.back().second;
  }
  units.emplace_back(n, n);
  std::vector<TransferBatch> plan;
  int previous_begin = 0, previous_end = 0;
  for (const auto& [begin, end] : units) {
    TransferBatch b;
    b.first_action = begin;
    b.end_action = end;
    for (int i = previous_begin; i < previous_end; ++i) {
      if (layout.Sends(actions[i])) b.send_actions.push_back(i);
    }
    if (!layout.v_shape || stage_actions == nullptr) {
      for (int i = begin; i < end; ++i) {
        if (layout.Receives(actions[i])) b.recv_actions.push_back(i);
      }
    }
    plan.push_back(std::move(b));
    previous_begin = begin;
    previous_end = end;
  }
  if (layout.v_shape && stage_actions != nullptr) {
    PlanVShapedInGlobalOrder(layout, *stage_actions, &plan);
  }
  return plan;
}

std::shared_ptr<comm::Work> PipelineP2P::Exchange(
    const std::vector<Transfer>& sends, const std::vector<Transfer>& recvs) {
  std::vector<comm::P2POp> ops;
  // No tags: the transfers match in posting order (see PlanTransfers).
  for (const Transfer& t : sends) {
    ops.push_back(comm::P2POp::Send(t.tensor, t.peer));
  }
  for (const Transfer& t : recvs) {
    ops.push_back(comm::P2POp::Recv(t.tensor, t.peer));
  }
  if (ops.empty()) return nullptr;
  return group_->BatchP2P(std::move(ops));
}

}  // namespace pipeline
}  // namespace mcc
