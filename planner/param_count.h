#ifndef PLANNER_PARAM_COUNT_H_
#define PLANNER_PARAM_COUNT_H_

#include <cstdint>

#include "models/gpt/gpt_config.h"

namespace mcc {
namespace planner {

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
// embedding on the first, the final norm and the output layer on the last;
// a tied output layer is a second copy only when pp > 1.
int64_t StageParams(const gpt::GPTConfig& config, int tp, int pp, int stage,
                    int layers);

// The whole model's parameters (TP 1, the tied weight once), without the
// padding rows of the vocabulary.
int64_t ModelParams(const gpt::GPTConfig& config);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_PARAM_COUNT_H_
