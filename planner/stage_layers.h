#ifndef PLANNER_STAGE_LAYERS_H_
#define PLANNER_STAGE_LAYERS_H_

// Which decoder layers each pipeline stage of a layout holds: the split
// train's pipeline runs (parallel/pipeline/layer_split.h), even or set by
// --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers.

#include <vector>

#include "absl/status/status.h"
#include "models/gpt/gpt_config.h"
#include "parallel/pipeline/layer_split.h"
#include "planner/layout.h"

namespace mcc {
namespace planner {

// Whether the layout sets the first or last stage's layer count.
bool UnevenSplit(const Layout& layout);

// The layout's split as train builds it (training's
// PipelineConfigFromConfig): interleaved layouts' chunk size, ZB-V's V,
// the first and last stages' counts.
pipeline::PipelineConfig PipelineSplitOf(const gpt::GPTConfig& model,
                                         const Layout& layout);

// Checks the split as train does; the message names train's flags.
absl::Status CheckStageSplit(const gpt::GPTConfig& model, const Layout& layout);

// Stage `stage`'s runs of layers, one per model chunk in chunk order (for a
// split CheckStageSplit refuses, each chunk's even share rounded down).
std::vector<pipeline::LayerRange> StageLayerRanges(const gpt::GPTConfig& model,
                                                   const Layout& layout,
                                                   int stage);
// Their total.
int StageLayerCount(const gpt::GPTConfig& model, const Layout& layout,
                    int stage);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_STAGE_LAYERS_H_
