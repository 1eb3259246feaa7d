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
  }
  return "?";
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
  if (kind != ScheduleKind::kInterleaved && chunks != 1) {
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
  return bubble;
}

}  // namespace pipeline
}  // namespace mcc
