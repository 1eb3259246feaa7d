#ifndef TRAINING_MOE_METRICS_H_
#define TRAINING_MOE_METRICS_H_

// Load balance you can see (issue 41): what the MoE layers routed between
// two log iterations, summed over data parallelism, as one log line per
// layer and TensorBoard scalars.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "models/gpt/gpt_model.h"
#include "models/gpt/stage_model.h"

namespace mcc {
namespace training {

// The stage's MoE layers' stats since the last call (StageModel::
// TakeMoeStats), token counts, loss sums and micro-batch counts summed over
// dp (null or size 1: this rank's). Collective over dp when this stage has
// MoE layers; empty for a dense model.
absl::StatusOr<std::vector<gpt::MoeLayerStats>> TakeMoeStatsOverDp(
    gpt::StageModel* model, comm::ProcessGroup* dp, Device device);

// "moe layer 1: tokens per expert [12 20 16 16] (max/mean 1.25) | balance
// loss 1.0123E-01 | z-loss 2.0000E-03": losses per micro-batch, times their
// coefficients as trained.
std::string MoeStatsLine(const gpt::MoeLayerStats& stats);

// TensorBoard scalars: Megatron's "load_balancing_loss" and "z_loss" (the
// mean over layers; only when the loss is on) and per layer
// "moe/load_balancing_loss_layer_{i}", "moe/z_loss_layer_{i}",
// "moe/max_over_mean_load_layer_{i}" and "moe/tokens_layer_{i}_expert_{e}".
std::vector<std::pair<std::string, double>> MoeScalars(
    const std::vector<gpt::MoeLayerStats>& stats);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_MOE_METRICS_H_
