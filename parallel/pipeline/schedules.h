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
  // ZB-V of the zero-bubble paper (Qi et al., "Pipeline parallelism with
  // controllable memory", 2024): two model chunks per stage placed in a V,
  // chunk 0 of stage s on virtual stage s and chunk 1 on 2P - 1 - s, so the
  // last stage hands chunk 0's output to its own chunk 1 and stage 0 holds
  // both the embeddings and the loss. Each stage warms up with chunk 0's
  // forwards, runs F/B/W triples of both chunks in the steady state and
  // defers W's into the cool-down. A stage holds at most 2P (micro-batch,
  // chunk) activations, each of half a 1F1B stage's layers: 1F1B's first
  // stage's peak in bytes.
  kZeroBubbleV,
};
std::string ScheduleName(ScheduleKind kind);

// Whether `kind` places its two chunks per stage in a V (ZB-V) rather than
// in Megatron's loop (chunk c of stage s on virtual stage c * P + s).
bool IsVShaped(ScheduleKind kind);
// The virtual stage (position in the model, 0 = embeddings) of chunk
// `chunk` on stage `stage` of `stages`, and the (stage, chunk) holding
// virtual stage `virtual_stage`, for either placement.
int VirtualStage(int stages, int stage, int chunk, bool v_shape);
void StageAndChunkOf(int stages, int virtual_stage, bool v_shape, int* stage,
                     int* chunk);

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
// ZB-V: the idle share of BuildSchedule's order run with every F, B and W
// of a chunk taking equal time (simulated; 0 in the paper's ideal, here
// the fill and drain its warm-up and cool-down leave).
double TheoreticalBubble(ScheduleKind kind, int stages, int chunks,
                         int microbatches);

}  // namespace pipeline
}  // namespace mcc

#endif  // PARALLEL_PIPELINE_SCHEDULES_H_
