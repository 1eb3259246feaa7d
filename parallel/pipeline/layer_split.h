#ifndef PARALLEL_PIPELINE_LAYER_SPLIT_H_
#define PARALLEL_PIPELINE_LAYER_SPLIT_H_

#include <vector>

#include "absl/status/statusor.h"

namespace mcc {
namespace pipeline {

// How the decoder's layers are split over pipeline stages, with Megatron's
// flags beside each field.
struct PipelineConfig {
  int num_layers = 1;     // --num-layers
  int pipeline_size = 1;  // --pipeline-model-parallel-size
  // --num-layers-per-virtual-pipeline-stage (0: no interleaving).
  int layers_per_virtual_stage = 0;
  // --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers
  // (0: unset): the first (last) stage's count; the rest split evenly.
  int first_stage_layers = 0;
  int last_stage_layers = 0;
  // --pipeline-schedule zbv: the two virtual stages of each stage are placed
  // in a V (chunk 1 of stage p holds the (2P - 1 - p)-th run of layers), so
  // stage 0 holds the embeddings and the output layer. With the first/last
  // stage flags (and no layers_per_virtual_stage) each stage's count is
  // halved over its two chunks.
  bool v_shape = false;

  int virtual_stages() const {
    if (layers_per_virtual_stage > 0) {
      return num_layers / (pipeline_size * layers_per_virtual_stage);
    }
    return v_shape ? 2 : 1;
  }
};

// One contiguous run of layers held by a (stage, virtual stage).
struct LayerRange {
  int first = 0;
  int count = 0;
};

// Checks the split; the message names the flags at fault.
absl::Status ValidatePipelineConfig(const PipelineConfig& config);

// The layer ranges of pipeline stage `stage`, one per virtual stage (model
// chunk) in order. Virtual stage v of stage p holds the (v * P + p)-th run
// of layers, as Megatron's interleaved schedule assigns them; V-shaped,
// virtual stage 1 of stage p holds the (2P - 1 - p)-th. V-shaped with an
// uneven split, the runs of stage p are half its count each.
absl::StatusOr<std::vector<LayerRange>> StageLayers(
    const PipelineConfig& config, int stage);

// Checks that the schedule can run `num_microbatches` (global batch /
// (micro-batch x DP)) with this split: the interleaved schedule needs a
// multiple of the pipeline size.
absl::Status ValidateMicroBatches(const PipelineConfig& config,
                                  int num_microbatches);

}  // namespace pipeline
}  // namespace mcc

#endif  // PARALLEL_PIPELINE_LAYER_SPLIT_H_
