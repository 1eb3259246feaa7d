#include "planner/stage_balance.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "parallel/pipeline/layer_split.h"

namespace mcc {
namespace planner {
namespace {

bool VShaped(const Layout& layout) {
  return layout.schedule == PipelineSchedule::kZeroBubbleV;
}

// Appends a stage of n layers: its time per micro-batch, with the embedding
// on the first stage and the output layer and loss on the last (on the
// first too under ZB-V, whose V turns back to stage 0).
void AddStage(const StepTime& time, int stage, int pp, bool v_shape, int n,
              StageSplit* split) {
  double s = n * time.layer_mb;
  if (stage == 0) s += time.embedding_mb;
  if (stage == (v_shape ? 0 : pp - 1)) s += time.head_mb;
  split->layers.push_back(n);
  split->seconds.push_back(s);
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
    AddStage(time, stage, layout.pp, c.v_shape, n, &split);
  }
  *out = std::move(split);
  return true;
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
  const int pp = std::max(1, layout.pp);
  split = StageSplit();
  for (int stage = 0; stage < pp; ++stage) {
    AddStage(time, stage, pp, VShaped(layout), job.model.num_layers / pp,
             &split);
  }
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
      StageSplit split;
      if (!SplitOf(job, layout, time, first, last, &split)) continue;
      const int flags = (first > 0) + (last > 0);
      const int best_flags =
          (best.first_stage_layers > 0) + (best.last_stage_layers > 0);
      // Better by more than rounding, or as good with fewer flags.
      const double margin = 1e-9 * best.bottleneck();
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

}  // namespace planner
}  // namespace mcc
