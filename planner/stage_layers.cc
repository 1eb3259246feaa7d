#include "planner/stage_layers.h"

#include <algorithm>

#include "parallel/pipeline/schedules.h"

namespace mcc {
namespace planner {

bool UnevenSplit(const Layout& l) {
  return l.first_stage_layers > 0 || l.last_stage_layers > 0;
}

pipeline::PipelineConfig PipelineSplitOf(const gpt::GPTConfig& model,
                                         const Layout& l) {
  pipeline::PipelineConfig c;
  c.num_layers = model.num_layers;
  c.pipeline_size = std::max(1, l.pp);
  c.first_stage_layers = l.first_stage_layers;
  c.last_stage_layers = l.last_stage_layers;
  c.v_shape = l.schedule == PipelineSchedule::kZeroBubbleV && l.pp > 1;
  // ZB-V with an uneven split halves each stage's layers over its two
  // chunks with no chunk size (train refuses one); every other layout with
  // virtual stages has one, so an uneven split beside it is refused as
  // train refuses it.
  const int chunks = std::max(1, l.virtual_stages);
  if (chunks > 1 && !(c.v_shape && UnevenSplit(l))) {
    c.layers_per_virtual_stage =
        std::max(1, model.num_layers / (c.pipeline_size * chunks));
  }
  return c;
}

absl::Status CheckStageSplit(const gpt::GPTConfig& model, const Layout& l) {
  return pipeline::ValidatePipelineConfig(PipelineSplitOf(model, l));
}

std::vector<pipeline::LayerRange> StageLayerRanges(const gpt::GPTConfig& model,
                                                   const Layout& l, int stage) {
  const pipeline::PipelineConfig c = PipelineSplitOf(model, l);
  auto ranges = pipeline::StageLayers(c, stage);
  if (ranges.ok()) return *std::move(ranges);
  // A split train refuses: each chunk its even share, rounded down.
  const int chunks = std::max(1, l.virtual_stages);
  const int per_chunk = model.num_layers / (c.pipeline_size * chunks);
  std::vector<pipeline::LayerRange> even;
  for (int k = 0; k < chunks; ++k) {
    even.push_back(
        {pipeline::VirtualStage(c.pipeline_size, stage, k, c.v_shape) *
             per_chunk,
         per_chunk});
  }
  return even;
}

int StageLayerCount(const gpt::GPTConfig& model, const Layout& l, int stage) {
  int n = 0;
  for (const pipeline::LayerRange& r : StageLayerRanges(model, l, stage)) {
    n += r.count;
  }
  return n;
}

}  // namespace planner
}  // namespace mcc
