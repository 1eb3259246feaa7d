#include "planner/stage_balance.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "parallel/pipeline/layer_split.h"
#include "parallel/pipeline/schedule_table.h"
#include "planner/memory_model.h"
#include "planner/schedule_walk.h"

namespace mcc {
namespace planner {
namespace {

bool VShaped(const Layout& layout) {
  return layout.schedule == PipelineSchedule::kZeroBubbleV;
}

// Appends a stage of n layers: its time per micro-batch, with the embedding
// on the first stage and the output layer and loss on `head_stage` (the
// last, or the first under ZB-V, whose V turns back to stage 0).
void AddStage(const StepTime& time, int stage, int head_stage, int n,
              StageSplit* split) {
  double s = n * time.layer_mb;
  double w = n * time.layer_weight_mb;
  if (stage == 0) s += time.embedding_mb;
  if (stage == head_stage) {
    s += time.head_mb;
    w += time.head_weight_mb;
  }
  split->layers.push_back(n);
  split->seconds.push_back(s);
  split->weight_seconds.push_back(w);
}

PipelineWork WorkOf(const StepTime& time) {
  return PipelineWork{time.layer_mb, time.layer_weight_mb, time.head_mb,
                      time.head_weight_mb, time.embedding_mb};
}

// The split the flags give, or nothing when they are refused.
bool SplitOf(const JobSpec& job, const Layout& layout, const StepTime& time,
             int first, int last, StageSplit* out) {
  pipeline::PipelineConfig c;
  c.num_layers = job.model.num_layers;
  c.pipeline_size = layout.pp;
  c.first_stage_layers = first;
  c.last_stage_layers = last;
  c.v_shape = VShaped(layout);
  if (c.v_shape && first == 0 && last == 0) {
    // ZB-V's even split is set by the chunk size.
    c.layers_per_virtual_stage = c.num_layers / (2 * std::max(1, layout.pp));
  }
  if (!pipeline::ValidatePipelineConfig(c).ok()) return false;
  StageSplit split;
  split.first_stage_layers = first;
  split.last_stage_layers = last;
  for (int stage = 0; stage < layout.pp; ++stage) {
    auto ranges = pipeline::StageLayers(c, stage);
    if (!ranges.ok()) return false;
    int n = 0;
    for (const pipeline::LayerRange& r : *ranges) n += r.count;
    if (n < 1) return false;
    AddStage(time, stage, c.v_shape ? 0 : layout.pp - 1, n, &split);
  }
  Layout at = layout;
  at.first_stage_layers = first;
  at.last_stage_layers = last;
  split.chunks = ChunkSecondsOf(job.model, at, WorkOf(time));
  *out = std::move(split);
  return true;
}

// The slowest stage's time of the split the flags give, from the stage
// counts alone (as SplitOf adds them up), or -1 where SplitOf refuses it:
// the rest must split evenly over the other stages, every stage at least one
// layer (an even count under ZB-V). The search below tries every pair, so
// this stays a few integer steps.
double CandidateBottleneck(const Layout& layout, const StepTime& time, int n,
                           int first, int last) {
  const int pp = layout.pp;
  const int rest = n - first - last;
  const int middle = pp - (first > 0) - (last > 0);
  if (n < pp || rest < 0 || (middle == 0 && rest != 0) ||
      (middle > 0 && rest % middle != 0)) {
    return -1;
  }
  const int each = middle > 0 ? rest / middle : 0;
  const int counts[3] = {first > 0 ? first : each, each,
                         last > 0 ? last : each};
  const bool v = VShaped(layout);
  const int head_stage = v ? 0 : pp - 1;
  double worst = 0;
  for (int k = 0; k < 3; ++k) {
    if (k == 1 && pp < 3) continue;  // No stage between the ends.
    const int c = counts[k];
    if (c < 1 || (v && c % 2 != 0)) return -1;
    const int stage = k == 0 ? 0 : k == 2 ? pp - 1 : 1;
    double s = c * time.layer_mb;
    if (stage == 0) s += time.embedding_mb;
    if (stage == head_stage) s += time.head_mb;
    worst = std::max(worst, s);
  }
  return worst;
}

}  // namespace

double StageSplit::bottleneck() const {
  return seconds.empty() ? 0
                         : *std::max_element(seconds.begin(), seconds.end());
}

double StageSplit::step_seconds(int micro_batches) const {
  const double slowest = bottleneck();
  return micro_batches * slowest +
         std::accumulate(seconds.begin(), seconds.end(), 0.0) - slowest;
}

double StageSplit::idle_share(int stage, int micro_batches) const {
  const double step = step_seconds(micro_batches);
  return step > 0 ? 1 - micro_batches * seconds[stage] / step : 0;
}

std::string StageSplit::Flags() const {
  std::string out;
  if (first_stage_layers > 0) {
    absl::StrAppend(&out, "--decoder-first-pipeline-num-layers ",
                    first_stage_layers);
  }
  if (last_stage_layers > 0) {
    absl::StrAppend(&out, out.empty() ? "" : " ",
                    "--decoder-last-pipeline-num-layers ", last_stage_layers);
  }
  return out.empty() ? "(even split, no flags)" : out;
}

StageSplit EvenStageSplit(const JobSpec& job, const Layout& layout,
                          const StepTime& time) {
  StageSplit split;
  if (layout.pp > 1 && (layout.virtual_stages == 1 || VShaped(layout)) &&
      SplitOf(job, layout, time, 0, 0, &split)) {
    return split;
  }
  // Interleaved or a single stage: the layers as the layout has them.
  // ZB-V's V puts the last virtual stage, with the head, on stage 0.
  const int pp = std::max(1, layout.pp);
  const int head_stage =
      layout.schedule == PipelineSchedule::kZeroBubbleV ? 0 : pp - 1;
  split = StageSplit();
  for (int stage = 0; stage < pp; ++stage) {
    AddStage(time, stage, head_stage, job.model.num_layers / pp, &split);
  }
  Layout even = layout;
  even.first_stage_layers = even.last_stage_layers = 0;
  split.chunks = ChunkSecondsOf(job.model, even, WorkOf(time));
  return split;
}

StageSplit BalancedStageSplit(const JobSpec& job, const Layout& layout,
                              const StepTime& time) {
  StageSplit best = EvenStageSplit(job, layout, time);
  if (layout.pp <= 1 || (layout.virtual_stages != 1 && !VShaped(layout))) {
    return best;
  }
  // The even split is refused when pp does not divide the layers.
  pipeline::PipelineConfig even;
  even.num_layers = job.model.num_layers;
  even.pipeline_size = layout.pp;
  bool have = pipeline::ValidatePipelineConfig(even).ok();
  const int n = job.model.num_layers;
  for (int first = 0; first < n; ++first) {
    for (int last = 0; last < n; ++last) {
      if (first == 0 && last == 0) continue;
      const int flags = (first > 0) + (last > 0);
      const int best_flags =
          (best.first_stage_layers > 0) + (best.last_stage_layers > 0);
      // Better by more than rounding, or as good with fewer flags.
      const double margin = 1e-9 * best.bottleneck();
      const double candidate =
          CandidateBottleneck(layout, time, n, first, last);
      if (candidate < 0 || (have && candidate > best.bottleneck() + margin) ||
          (have && candidate >= best.bottleneck() - margin &&
           flags >= best_flags)) {
        continue;
      }
      StageSplit split;
      if (!SplitOf(job, layout, time, first, last, &split)) continue;
      if (!have || split.bottleneck() < best.bottleneck() - margin ||
          (split.bottleneck() <= best.bottleneck() + margin &&
           flags < best_flags)) {
        best = split;
        have = true;
      }
    }
  }
  return best;
}

StageSplit LayoutStageSplit(const JobSpec& job, const Layout& layout,
                            const StepTime& time) {
  StageSplit split;
  if (layout.pp > 1 &&
      (layout.first_stage_layers > 0 || layout.last_stage_layers > 0) &&
      SplitOf(job, layout, time, layout.first_stage_layers,
              layout.last_stage_layers, &split)) {
    return split;
  }
  return EvenStageSplit(job, layout, time);
}

double ScheduleStepSeconds(const JobSpec& job, const Layout& layout,
                           const StageSplit& split, std::string* schedule) {
  const int m = NumMicroBatches(job, layout);
  if (schedule != nullptr) {
    switch (layout.schedule) {
      case PipelineSchedule::kOneFOneB:
        *schedule = layout.virtual_stages > 1 ? "interleaved 1F1B" : "1F1B";
        break;
      case PipelineSchedule::kZeroBubbleH1:
        *schedule = "ZB-H1";
        break;
      case PipelineSchedule::kFile:
        *schedule = "the schedule file's";
        break;
      case PipelineSchedule::kZeroBubbleV:
        *schedule = "ZB-V";
        break;
    }
  }
  if (layout.pp <= 1 ||
      (layout.schedule == PipelineSchedule::kOneFOneB &&
       layout.virtual_stages == 1) ||
      split.seconds.size() != static_cast<size_t>(layout.pp)) {
    return split.step_seconds(m);
  }
  auto table = LayoutScheduleTable(job, layout, m);
  if (!table.ok()) return split.step_seconds(m);
  // Each chunk's own time where the split has it.
  const size_t ranks = static_cast<size_t>(layout.pp);
  if (split.chunks.total.size() == ranks &&
      split.chunks.weight.size() == ranks) {
    auto step = WalkStepSeconds(*table, split.chunks);
    if (step.ok()) return *step;
  }
  // Otherwise a stage's time is shared by its model chunks.
  const double chunks = std::max(1, layout.virtual_stages);
  auto step = SimulateStepSeconds(*table, [&](const pipeline::ScheduleRow& r) {
    const double s = split.seconds[r.rank] / chunks;
    const double w = split.weight_seconds[r.rank] / chunks;
    switch (r.op) {
      case pipeline::ScheduleOp::kForward:
        return s / 3;
      case pipeline::ScheduleOp::kBackward:
        return 2 * s / 3 - w;
      case pipeline::ScheduleOp::kWeight:
        return w;
    }
    return 0.0;
  });
  return step.ok() ? *step : split.step_seconds(m);
}

}  // namespace planner
}  // namespace mcc
