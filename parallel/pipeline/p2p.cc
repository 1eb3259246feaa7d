#include "parallel/pipeline/p2p.h"

#include <algorithm>
#include <map>

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

// ZB-V's receives (see PlanTransfers). Each is posted in the batch before
// its unit; then, per peer, a receive moves up to the batch
// of any that the peer's send order puts after it (received ahead), and
// each batch posts a peer's receives in that order.
void PlanVShapedReceives(const StageLayout& layout,
                         const std::vector<Action>& actions,
                         const std::vector<std::vector<Action>>& stage_actions,
                         std::vector<TransferBatch>* plan) {
  const int n = static_cast<int>(actions.size());
  std::vector<int> unit_of(n, 0);
  for (size_t u = 0; u < plan->size(); ++u) {
    for (int i = (*plan)[u].first_action; i < (*plan)[u].end_action; ++i) {
      unit_of[i] = static_cast<int>(u);
    }
  }
  std::vector<int> post_at(n, -1);
  for (int i = 0; i < n; ++i) {
    if (layout.Receives(actions[i])) post_at[i] = unit_of[i];
  }
  // Per peer, this stage's receiving actions in the order the peer sends
  // their inputs.
  std::map<int, std::vector<int>> channels;
  for (int peer = 0; peer < layout.stages; ++peer) {
    if (peer == layout.stage) continue;
    const StageLayout from{layout.stages, peer, layout.chunks, true};
    for (const Action& a : stage_actions[peer]) {
      if (!from.Sends(a) || from.Destination(a) != layout.stage) continue;
      const Action wanted = from.Consumer(a);
      for (int i = 0; i < n; ++i) {
        if (actions[i] == wanted) channels[peer].push_back(i);
      }
    }
  }
  for (auto& [peer, order] : channels) {
    for (int k = static_cast<int>(order.size()) - 2; k >= 0; --k) {
      post_at[order[k]] = std::min(post_at[order[k]], post_at[order[k + 1]]);
    }
    for (int i : order) (*plan)[post_at[i]].recv_actions.push_back(i);
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
    const bool pair = layout.chunks > 1 && steady && i + 1 < n &&
                      actions[i].kind == Action::kForward &&
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
    PlanVShapedReceives(layout, actions, *stage_actions, &plan);
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
