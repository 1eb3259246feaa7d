#ifndef PLANNER_PARAM_COUNT_H_
#define PLANNER_PARAM_COUNT_H_

#include <array>
#include <cstdint>

#include "models/gpt/gpt_config.h"

namespace mcc {
namespace planner {

// One linear layer of a transformer layer at full size (TP 1): output x
// input features; TP splits the output of a column-parallel layer and the
// input of a row-parallel one.
struct LinearShape {
  int64_t out = 0;
  int64_t in = 0;
  bool column_parallel = true;
  int64_t OutPerRank(int tp) const { return column_parallel ? out / tp : out; }
  int64_t InPerRank(int tp) const { return column_parallel ? in : in / tp; }
};

// A layer's linear layers as models/gpt builds them, in the order they run:
// QKV (column), the attention projection (row), FC1 (column; two halves
// under SwiGLU) and FC2 (row).
enum LayerLinear { kQkv = 0, kProjection, kFc1, kFc2 };
std::array<LinearShape, 4> LayerLinears(const gpt::GPTConfig& config);

// Parameter elements one tensor-parallel rank holds, as models/gpt builds
// them: norms (weight, and bias under LayerNorm) and row-parallel biases
// replicated, column-parallel weights and biases and row-parallel weights
// split over TP.
struct ParamCount {
  int64_t layer = 0;      // One transformer layer.
  int64_t embedding = 0;  // Word embedding rows / TP, plus learned positions.
  int64_t final_norm = 0;
  int64_t output_layer = 0;  // Padded vocabulary / TP x hidden.
};
ParamCount CountParams(const gpt::GPTConfig& config, int tp);

// Elements on pipeline rank `stage` of `pp` holding `layers` layers: the
// embedding on the first, the final norm and the output layer on
// `head_stage` (-1: the last; ZB-V's V puts them on the first); a tied
// output layer is a second copy only when pp > 1.
int64_t StageParams(const gpt::GPTConfig& config, int tp, int pp, int stage,
                    int layers, int head_stage = -1);

// The whole model's parameters (TP 1, the tied weight once), without the
// padding rows of the vocabulary; every expert of a mixture of experts.
int64_t ModelParams(const gpt::GPTConfig& config);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_PARAM_COUNT_H_
