#include "parallel/pipeline/p2p.h"

namespace mcc {
namespace pipeline {

bool StageLayout::Receives(const Action& a) const {
  if (stages <= 1 || a.kind == Action::kWeight) return false;
  if (a.kind == Action::kForward) return !(stage == 0 && a.chunk == 0);
  return !(stage == stages - 1 && a.chunk == chunks - 1);
}

int StageLayout::Source(const Action& a) const {
  return a.kind == Action::kForward ? Prev() : Next();
}

bool StageLayout::Sends(const Action& a) const {
  if (stages <= 1 || a.kind == Action::kWeight) return false;
  if (a.kind == Action::kForward) {
    return !(stage == stages - 1 && a.chunk == chunks - 1);
  }
  return !(stage == 0 && a.chunk == 0);
}

int StageLayout::Destination(const Action& a) const {
  return a.kind == Action::kForward ? Next() : Prev();
}

Action StageLayout::Consumer(const Action& a) const {
  Action c = a;
  if (a.kind == Action::kForward) {
    if (stage == stages - 1) ++c.chunk;
  } else if (stage == 0) {
    --c.chunk;
  }
  return c;
}

std::vector<TransferBatch> PlanTransfers(const StageLayout& layout,
                                         const std::vector<Action>& actions) {
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
    for (int i = begin; i < end; ++i) {
      if (layout.Receives(actions[i])) b.recv_actions.push_back(i);
    }
    plan.push_back(std::move(b));
    previous_begin = begin;
    previous_end = end;
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
