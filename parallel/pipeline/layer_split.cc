#include "parallel/pipeline/layer_split.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "parallel/pipeline/schedules.h"

namespace mcc {
namespace pipeline {

absl::Status ValidatePipelineConfig(const PipelineConfig& c) {
  const int p = c.pipeline_size;
  if (p < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-model-parallel-size must be at least 1, not ", p));
  }
  if (c.num_layers < p) {
    return absl::InvalidArgumentError(
        absl::StrCat("--num-layers ", c.num_layers, " is fewer than the ", p,
                     " pipeline stages (--pipeline-model-parallel-size)"));
  }
  const bool uneven = c.first_stage_layers > 0 || c.last_stage_layers > 0;
  if (c.first_stage_layers < 0 || c.last_stage_layers < 0) {
    return absl::InvalidArgumentError(
        "--decoder-first-pipeline-num-layers and "
        "--decoder-last-pipeline-num-layers must not be negative");
  }
  if (c.v_shape && uneven) {
    // ZB-V with the balanced split: each stage's layers, halved.
    if (c.layers_per_virtual_stage != 0) {
      return absl::InvalidArgumentError(
          "--pipeline-schedule zbv with --decoder-first-pipeline-num-layers / "
          "--decoder-last-pipeline-num-layers halves each stage's layers over "
          "its two chunks: leave --num-layers-per-virtual-pipeline-stage "
          "unset");
    }
  } else if (c.v_shape &&
             (c.layers_per_virtual_stage <= 0 || p < 2 ||
              c.num_layers % (p * c.layers_per_virtual_stage) != 0 ||
              c.virtual_stages() != 2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pipeline-schedule zbv runs two model chunks per stage: it needs "
        "--pipeline-model-parallel-size of at least 2 and "
        "--num-layers-per-virtual-pipeline-stage = --num-layers / (2 x "
        "--pipeline-model-parallel-size) (--num-layers ",
        c.num_layers, ", --pipeline-model-parallel-size ", p,
        ", --num-layers-per-virtual-pipeline-stage ",
        c.layers_per_virtual_stage, ")"));
  }
  if (c.layers_per_virtual_stage != 0) {
    if (p < 2) {
      return absl::InvalidArgumentError(
          "--num-layers-per-virtual-pipeline-stage needs "
          "--pipeline-model-parallel-size of at least 2");
    }
    if (uneven) {
      // Megatron takes the chunk count from
      // --num-virtual-stages-per-pipeline-rank then, which is not built.
      return absl::InvalidArgumentError(
          "--num-layers-per-virtual-pipeline-stage (the interleaved "
          "schedule) cannot be combined with "
          "--decoder-first-pipeline-num-layers / "
          "--decoder-last-pipeline-num-layers (--pipeline-schedule zbv can)");
    }
    if (c.layers_per_virtual_stage < 0 ||
        c.num_layers % (p * c.layers_per_virtual_stage) != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--num-layers ", c.num_layers,
                       " is not divisible by --pipeline-model-parallel-size ",
                       p, " x --num-layers-per-virtual-pipeline-stage ",
                       c.layers_per_virtual_stage));
    }
    return absl::OkStatus();
  }
  if (!uneven) {
    if (c.num_layers % p != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--num-layers ", c.num_layers,
          " is not divisible by --pipeline-model-parallel-size ", p,
          "; set --decoder-first-pipeline-num-layers and/or "
          "--decoder-last-pipeline-num-layers for an uneven split"));
    }
    return absl::OkStatus();
  }
  int rest = c.num_layers - c.first_stage_layers - c.last_stage_layers;
  int middle = p;
  if (c.first_stage_layers > 0) --middle;
  if (c.last_stage_layers > 0) --middle;
  if (p == 1 || rest < 0 || (middle == 0 && rest != 0) ||
      (middle > 0 && rest % middle != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--decoder-first-pipeline-num-layers ", c.first_stage_layers,
        " and --decoder-last-pipeline-num-layers ", c.last_stage_layers,
        " leave ", rest, " of --num-layers ", c.num_layers,
        " layers, which do not split evenly over the other ", middle, " of ", p,
        " stages"));
  }
  if (c.v_shape) {
    for (int stage = 0; stage < p; ++stage) {
      const int n =
          stage == 0 && c.first_stage_layers > 0      ? c.first_stage_layers
          : stage == p - 1 && c.last_stage_layers > 0 ? c.last_stage_layers
                                                      : rest / middle;
      if (n < 2 || n % 2 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--pipeline-schedule zbv halves each stage's layers over its two "
            "chunks, but --decoder-first-pipeline-num-layers ",
            c.first_stage_layers, " and --decoder-last-pipeline-num-layers ",
            c.last_stage_layers, " give stage ", stage, " ", n, " of ",
            c.num_layers, " layers (each stage needs an even count)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<LayerRange>> StageLayers(const PipelineConfig& c,
                                                    int stage) {
  MCC_RETURN_IF_ERROR(ValidatePipelineConfig(c));
  const int p = c.pipeline_size;
  if (stage < 0 || stage >= p) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline stage ", stage, " is outside [0, ", p, ")"));
  }
  std::vector<LayerRange> ranges;
  if (c.layers_per_virtual_stage > 0) {
    const int n = c.layers_per_virtual_stage;
    for (int v = 0; v < c.virtual_stages(); ++v) {
      ranges.push_back({VirtualStage(p, stage, v, c.v_shape) * n, n});
    }
    return ranges;
  }
  std::vector<int> counts(p, 0);
  int rest = c.num_layers, middle = p;
  if (c.first_stage_layers > 0) {
    counts[0] = c.first_stage_layers;
    rest -= counts[0];
    --middle;
  }
  if (c.last_stage_layers > 0) {
    counts[p - 1] = c.last_stage_layers;
    rest -= counts[p - 1];
    --middle;
  }
  for (int i = 0; i < p; ++i) {
    const bool fixed = (i == 0 && c.first_stage_layers > 0) ||
                       (i == p - 1 && c.last_stage_layers > 0);
    if (!fixed) counts[i] = rest / middle;
  }
  if (c.v_shape) {
    // Virtual stage v holds half of its stage's layers, after those of
    // virtual stages 0 .. v - 1.
    int first = 0;
    ranges.resize(2);
    for (int v = 0; v < 2 * p; ++v) {
      int s = 0, chunk = 0;
      StageAndChunkOf(p, v, true, &s, &chunk);
      if (s == stage) ranges[chunk] = {first, counts[s] / 2};
      first += counts[s] / 2;
    }
    return ranges;
  }
  int first = 0;
  for (int i = 0; i < stage; ++i) first += counts[i];
  ranges.push_back({first, counts[stage]});
  return ranges;
}

absl::Status ValidateMicroBatches(const PipelineConfig& c,
                                  int num_microbatches) {
  if (num_microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the step has ", num_microbatches,
        " micro-batches (--global-batch-size / (--micro-batch-size x "
        "data-parallel size)); it needs at least one"));
  }
  if (c.virtual_stages() > 1 && num_microbatches % c.pipeline_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the interleaved schedule (--num-layers-per-virtual-pipeline-stage; "
        "also zbv's two chunks) needs the number of micro-batches (",
        num_microbatches,
        " = --global-batch-size / (--micro-batch-size x data-parallel size)) "
        "to be a multiple of --pipeline-model-parallel-size ",
        c.pipeline_size));
  }
  return absl::OkStatus();
}

}  // namespace pipeline
}  // namespace mcc
