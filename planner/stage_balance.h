#ifndef PLANNER_STAGE_BALANCE_H_
#define PLANNER_STAGE_BALANCE_H_

// Balancing the pipeline stages: the last stage carries the output layer and
// the loss, the first the embedding, so an even split of the decoder layers
// leaves the other stages idle while the slowest one works (no schedule
// removes that). The split Megatron's --decoder-first-pipeline-num-layers and
// --decoder-last-pipeline-num-layers express that gives the smallest
// predicted bottleneck stage.

#include <string>
#include <vector>

#include "planner/job_spec.h"
#include "planner/layout.h"
#include "planner/schedule_walk.h"
#include "planner/step_time_model.h"

namespace mcc {
namespace planner {

struct StageSplit {
  // Megatron's flags; 0 is unset (the rest split evenly).
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  std::vector<int> layers;      // Per stage.
  std::vector<double> seconds;  // Per stage, per micro-batch, fwd + bwd.
  // Of `seconds`, the weight-gradient step W of a schedule that splits the
  // backward (0 otherwise).
  std::vector<double> weight_seconds;
  // `seconds` and `weight_seconds` by stage and model chunk: each chunk's
  // layers, the embedding on virtual stage 0 and the output layer on the
  // last (stage 0's second chunk under ZB-V). Empty: a stage's time shared
  // evenly by its chunks.
  ChunkSeconds chunks;
  double bottleneck() const;  // The slowest stage's seconds.
  // A 1F1B step of m micro-batches: the slowest stage runs all m, the
  // others' one micro-batch each fill and drain around it.
  double step_seconds(int micro_batches) const;
  // The share of that step a stage waits: 1 - m x its time / the step
  // ((p - 1) / (m + p - 1) for every stage when they are equal).
  double idle_share(int stage, int micro_batches) const;
  std::string Flags() const;  // "--decoder-first-pipeline-num-layers 5 ..."
};

// The even split (no flags), and the best split of those the flags can
// express (every stage at least one layer), by the step-time model's
// per-layer, output-layer and embedding times (`time` from
// EstimateStepTime for `layout`). Ties keep the even split, then the fewer
// flags. Only for pp > 1 without virtual stages (Megatron's uneven flags do
// not combine with interleaving) or under ZB-V (each stage's count halved
// over its two chunks, the output layer on stage 0 beside the embedding);
// otherwise both are the even split.
StageSplit EvenStageSplit(const JobSpec& job, const Layout& layout,
                          const StepTime& time);
StageSplit BalancedStageSplit(const JobSpec& job, const Layout& layout,
                              const StepTime& time);
// The split the layout's own first and last stage counts give (the even one
// when it sets neither or the flags refuse them).
StageSplit LayoutStageSplit(const JobSpec& job, const Layout& layout,
                            const StepTime& time);

// The step of `split` under the layout's own schedule: the table the
// executor runs (LayoutScheduleTable) walked with each chunk's forward a
// third of its time, W its weight share and B the rest (WalkStepSeconds
// over split.chunks; ZB-V's head on stage 0's second chunk). 1F1B keeps
// StageSplit::step_seconds' closed form.
// The name of that schedule ("1F1B", "ZB-H1", "the schedule file's") goes
// to *schedule when given.
double ScheduleStepSeconds(const JobSpec& job, const Layout& layout,
                           const StageSplit& split,
                           std::string* schedule = nullptr);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_STAGE_BALANCE_H_
