#ifndef PARALLEL_PIPELINE_SCHEDULES_H_
#define PARALLEL_PIPELINE_SCHEDULES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mcc {
namespace pipeline {

// One step of a pipeline schedule on one stage: the forward or backward of
// micro-batch `microbatch` through model chunk (virtual stage) `chunk`. A
// schedule that splits the backward (zero-bubble) runs kBackward as the
// input-gradient step (B) and kWeight as the weight-gradient step (W) of
// the same micro-batch later; without kWeight actions kBackward is the
// whole backward.
struct Action {
  enum Kind { kForward, kBackward, kWeight };
  Kind kind = kForward;
  int microbatch = 0;
  int chunk = 0;
  bool operator==(const Action& o) const {
    return kind == o.kind && microbatch == o.microbatch && chunk == o.chunk;
  }
};
std::string ActionString(const Action& a);  // "F3.1", "B0.0", "W2.0"

enum class ScheduleKind {
  // One stage: forward and backward of each micro-batch in turn (gradient
  // accumulation; Megatron's forward_backward_no_pipelining).
  kNoPipelining,
  // Every forward, then every backward (GPipe's fill and drain): keeps all
  // micro-batches' activations; a reference for 1F1B's memory.
  kAllForwardAllBackward,
  // Warm-up forwards, one-forward-one-backward steady state, cool-down
  // backwards (PipeDream-flush, Megatron's default).
  kOneFOneB,
  // 1F1B over virtual stages (Megatron's interleaved schedule).
  kInterleaved,
  // ZB-H1 of the zero-bubble paper (Qi et al., 2023): 1F1B's forwards and
  // input-gradient backwards in 1F1B's order, with each stage's weight
  // gradients (W) deferred: stage s keeps up to s of them pending through
  // the steady state and runs them in the cool-down, where 1F1B idles. A
  // stage holds an activation from its forward to its W, at most
  // min(stages, micro-batches) at once: 1F1B's first stage's peak.
  kZeroBubbleH1,
};
std::string ScheduleName(ScheduleKind kind);

// The order of actions stage `stage` of `stages` runs for one step of
// `microbatches` micro-batches over `chunks` model chunks per stage. With
// forward_only every action is a forward (evaluation).
absl::StatusOr<std::vector<Action>> BuildSchedule(ScheduleKind kind, int stages,
                                                  int stage, int chunks,
                                                  int microbatches,
                                                  bool forward_only = false);

// The schedule's idle fraction: (P - 1) / (m + P - 1) for 1F1B and fill and
// drain, divided by the virtual-stage count when interleaved; 0 without
// pipelining. ZB-H1: (P - 1) / (3m + P - 1), the paper's (P - 1)(F + B - W)
// idle time over m(F + B + W) of compute with F, B and W taking equal time.
double TheoreticalBubble(ScheduleKind kind, int stages, int chunks,
                         int microbatches);

}  // namespace pipeline
}  // namespace mcc

#endif  // PARALLEL_PIPELINE_SCHEDULES_H_
