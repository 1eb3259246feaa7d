#include "parallel/pipeline/schedules.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace pipeline {

std::string ActionString(const Action& a) {
  const char* letter = a.kind == Action::kForward    ? "F"
                       : a.kind == Action::kBackward ? "B"
                                                     : "W";
  return absl::StrCat(letter, a.microbatch, ".", a.chunk);
}

std::string ScheduleName(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kNoPipelining:
      return "no pipelining";
    case ScheduleKind::kAllForwardAllBackward:
      return "all-forward-all-backward";
    case ScheduleKind::kOneFOneB:
      return "1F1B";
    case ScheduleKind::kInterleaved:
      return "interleaved 1F1B";
    case ScheduleKind::kZeroBubbleH1:
      return "ZB-H1";
    case ScheduleKind::kZeroBubbleV:
      return "ZB-V";
  }
  return "?";
}

bool IsVShaped(ScheduleKind kind) { return kind == ScheduleKind::kZeroBubbleV; }

int VirtualStage(int stages, int stage, int chunk, bool v_shape) {
  if (v_shape && chunk % 2 == 1) {
    return (chunk + 1) * stages - 1 - stage;
  }
  return chunk * stages + stage;
}

void StageAndChunkOf(int stages, int virtual_stage, bool v_shape, int* stage,
                     int* chunk) {
  *chunk = virtual_stage / stages;
  *stage = virtual_stage % stages;
  if (v_shape && *chunk % 2 == 1) *stage = stages - 1 - *stage;
}

namespace {

// Interleaved order: virtual micro-batch k runs chunk (k mod PV) / P
// (reversed for backward) on micro-batch (k / PV) * P + k mod P, so each
// group of P micro-batches passes through every chunk before the next.
Action InterleavedAction(int k, int stages, int chunks, bool forward) {
  const int group = stages * chunks;
  int chunk = (k % group) / stages;
  if (!forward) chunk = chunks - 1 - chunk;
  return {forward ? Action::kForward : Action::kBackward,
          (k / group) * stages + k % stages, chunk};
}

// ZB-V's order on stage r of P (the zero-bubble paper's figure, as
// torchtitan's ScheduleZBVZeroBubble lays it out), built for at least
// 2P - 1 micro-batches, the count that fills the V; with fewer the rows of
// the missing micro-batches are dropped (nothing else waits for them).
std::vector<Action> ZeroBubbleV(int stages, int stage, int m) {
  const int p = stages, r = stage;
  const int n = std::max(m, 2 * p - 1);
  std::vector<Action> out;
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0, w0 = 0, w1 = 0;
  auto add = [&](Action::Kind kind, int* count, int chunk) {
    out.push_back({kind, (*count)++, chunk});
  };
  // Warm-up: chunk 0's forwards travel down the V; the deeper the stage,
  // the sooner its chunk 1 (the way back up) has work.
  for (int i = 0; i < 2 * (p - r) - 1; ++i) add(Action::kForward, &f0, 0);
  for (int i = 0; i < r; ++i) {
    add(Action::kForward, &f1, 1);
    add(Action::kForward, &f0, 0);
  }
  for (int i = 0; i < p - r; ++i) {
    add(Action::kForward, &f1, 1);
    add(Action::kBackward, &b1, 1);
    add(Action::kWeight, &w1, 1);
  }
  // Steady state: F, B and W of chunk 0, then of chunk 1.
  while (f1 < f0 || f0 < n) {
    if (f0 < n) add(Action::kForward, &f0, 0);
    add(Action::kBackward, &b0, 0);
    add(Action::kWeight, &w0, 0);
    add(Action::kForward, &f1, 1);
    add(Action::kBackward, &b1, 1);
    add(Action::kWeight, &w1, 1);
  }
  // Cool-down: the remaining B's, with W's filling where stage r would
  // wait for the next gradient; the rest of the W's at the end.
  for (int i = 0; i < r; ++i) {
    add(Action::kBackward, &b0, 0);
    add(Action::kBackward, &b1, 1);
  }
  for (int i = 0; i < p - r; ++i) {
    add(Action::kBackward, &b0, 0);
    add(Action::kWeight, &w0, 0);
  }
  while (w1 < b1) add(Action::kWeight, &w1, 1);
  while (w0 < b0) add(Action::kWeight, &w0, 0);
  if (n > m) {
    out.erase(
        std::remove_if(out.begin(), out.end(),
                       [m](const Action& a) { return a.microbatch >= m; }),
        out.end());
  }
  return out;
}

// The idle share of ZB-V's order with every F, B and W of a chunk taking one
// unit of time and transfers none: each stage runs its actions in order,
// each as soon as the stage is free and what it needs has finished.
double ZeroBubbleVBubble(int stages, int m) {
  if (m < 1 || stages < 2) return 0.0;
  const int p = stages, vs = 2 * p;
  std::vector<std::vector<Action>> orders(p);
  for (int r = 0; r < p; ++r) orders[r] = ZeroBubbleV(p, r, m);
  // Finish time per (op kind, virtual stage, micro-batch); -1 until run.
  std::vector<double> finish(3 * vs * m, -1);
  auto at = [&](int kind, int v, int mb) -> double& {
    return finish[(kind * vs + v) * m + mb];
  };
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (next[r] < orders[r].size()) {
        const Action& a = orders[r][next[r]];
        const int v = VirtualStage(p, r, a.chunk, true);
        double ready = free_at[r];
        bool can = true;
        auto need = [&](int kind, int stage) {
          const double t = at(kind, stage, a.microbatch);
          can &= t >= 0;
          ready = std::max(ready, t);
        };
        if (a.kind == Action::kForward && v > 0) need(Action::kForward, v - 1);
        if (a.kind == Action::kBackward) {
          need(Action::kForward, v);
          if (v < vs - 1) need(Action::kBackward, v + 1);
        }
        if (a.kind == Action::kWeight) need(Action::kBackward, v);
        if (!can) break;
        free_at[r] = ready + 1;
        at(a.kind, v, a.microbatch) = free_at[r];
        ++next[r];
        progress = true;
      }
    }
  }
  const double total = *std::max_element(free_at.begin(), free_at.end());
  return total > 0 ? 1.0 - 6.0 * m / total : 0.0;
}

}  // namespace

absl::StatusOr<std::vector<Action>> BuildSchedule(ScheduleKind kind, int stages,
                                                  int stage, int chunks,
                                                  int microbatches,
                                                  bool forward_only) {
  if (stages < 1 || stage < 0 || stage >= stages || chunks < 1 ||
      microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline schedule: stage ", stage, " of ", stages, ", ",
                     chunks, " chunks, ", microbatches, " micro-batches"));
  }
  if (kind == ScheduleKind::kZeroBubbleV && chunks != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ZB-V runs two model chunks per stage (a V), not ", chunks));
  }
  if (kind == ScheduleKind::kZeroBubbleV && stages < 2) {
    return absl::InvalidArgumentError("ZB-V needs at least 2 stages");
  }
  if (kind != ScheduleKind::kInterleaved &&
      kind != ScheduleKind::kZeroBubbleV && chunks != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        ScheduleName(kind), " runs one model chunk per stage, not ", chunks));
  }
  if (kind == ScheduleKind::kNoPipelining && stages != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("no pipelining runs on one stage, not ", stages));
  }
  const int m = microbatches;
  std::vector<Action> out;
  auto fwd = [](int mb, int c) { return Action{Action::kForward, mb, c}; };
  auto bwd = [](int mb, int c) { return Action{Action::kBackward, mb, c}; };
  auto wgt = [](int mb, int c) { return Action{Action::kWeight, mb, c}; };
  if (kind == ScheduleKind::kInterleaved && forward_only) {
    // Groups of P micro-batches pass through every chunk in turn; the last
    // group may be short.
    for (int g = 0; g < m; g += stages) {
      for (int c = 0; c < chunks; ++c) {
        for (int mb = g; mb < std::min(m, g + stages); ++mb) {
          out.push_back(fwd(mb, c));
        }
      }
    }
    return out;
  }
  if (kind == ScheduleKind::kInterleaved) {
    if (m % stages != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the interleaved schedule needs the micro-batch count (", m,
          ") to be a multiple of the pipeline size (", stages, ")"));
    }
    const int total = m * chunks;
    int warmup;
    if (m == stages) {
      warmup = total;
    } else {
      warmup =
          std::min(total, (stages - stage - 1) * 2 + (chunks - 1) * stages);
    }
    for (int k = 0; k < warmup; ++k) {
      out.push_back(InterleavedAction(k, stages, chunks, true));
    }
    for (int k = 0; k < total - warmup; ++k) {
      out.push_back(InterleavedAction(warmup + k, stages, chunks, true));
      out.push_back(InterleavedAction(k, stages, chunks, false));
    }
    for (int k = total - warmup; k < total; ++k) {
      out.push_back(InterleavedAction(k, stages, chunks, false));
    }
    return out;
  }
  if (kind == ScheduleKind::kZeroBubbleV && forward_only) {
    // Down the V's first arm, then up the second: every chunk-0 forward
    // precedes the chunk-1 forwards, which need the last stage's.
    for (int c = 0; c < 2; ++c) {
      for (int i = 0; i < m; ++i) out.push_back(fwd(i, c));
    }
    return out;
  }
  if (kind == ScheduleKind::kZeroBubbleV) return ZeroBubbleV(stages, stage, m);
  if (forward_only) {
    for (int i = 0; i < m; ++i) out.push_back(fwd(i, 0));
    return out;
  }
  switch (kind) {
    case ScheduleKind::kNoPipelining:
      for (int i = 0; i < m; ++i) {
        out.push_back(fwd(i, 0));
        out.push_back(bwd(i, 0));
      }
      break;
    case ScheduleKind::kAllForwardAllBackward:
      for (int i = 0; i < m; ++i) out.push_back(fwd(i, 0));
      for (int i = 0; i < m; ++i) out.push_back(bwd(i, 0));
      break;
    default: {
      const int warmup = std::min(stages - stage - 1, m);
      for (int i = 0; i < warmup; ++i) out.push_back(fwd(i, 0));
      for (int i = 0; i < m - warmup; ++i) {
        out.push_back(fwd(warmup + i, 0));
        out.push_back(bwd(i, 0));
      }
      for (int i = m - warmup; i < m; ++i) out.push_back(bwd(i, 0));
      break;
    }
    case ScheduleKind::kZeroBubbleH1: {
      // 1F1B's F and B order, so the same transfers in the same order; W
      // has no neighbour. Stage s lets up to s W's wait in the steady state
      // (the later stages' B's then reach the earlier stages sooner), and
      // every cool-down B is followed by one W, filling the wait for the
      // next gradient; the rest run at the end.
      const int warmup = std::min(stages - stage - 1, m);
      const int deferred = stage;
      int next_w = 0;
      for (int i = 0; i < warmup; ++i) out.push_back(fwd(i, 0));
      for (int i = 0; i < m - warmup; ++i) {
        out.push_back(fwd(warmup + i, 0));
        out.push_back(bwd(i, 0));
        if (i + 1 - next_w > deferred) out.push_back(wgt(next_w++, 0));
      }
      for (int i = m - warmup; i < m; ++i) {
        out.push_back(bwd(i, 0));
        out.push_back(wgt(next_w++, 0));
      }
      while (next_w < m) out.push_back(wgt(next_w++, 0));
      break;
    }
  }
  return out;
}

double TheoreticalBubble(ScheduleKind kind, int stages, int chunks,
                         int microbatches) {
  if (kind == ScheduleKind::kNoPipelining || stages <= 1) return 0.0;
  const double p = stages, m = microbatches;
  double bubble = (p - 1) / (m + p - 1);
  if (kind == ScheduleKind::kInterleaved) bubble /= chunks;
  if (kind == ScheduleKind::kZeroBubbleH1) bubble = (p - 1) / (3 * m + p - 1);
  if (kind == ScheduleKind::kZeroBubbleV)
    bubble = ZeroBubbleVBubble(stages, microbatches);
  return bubble;
}

}  // namespace pipeline
}  // namespace mcc
