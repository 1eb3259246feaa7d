#ifndef TRAINING_EVALUATION_H_
#define TRAINING_EVALUATION_H_

#include <functional>

#include "absl/status/statusor.h"
#include "data/loader.h"
#include "training/job.h"
#include "training/trainer.h"

namespace mcc {
namespace training {

// Runs the forward passes of `n` micro-batches the model holds: a Trainer's
// Evaluate, or Evaluate over an executor of the job's stages (trainer.h).
using EvaluateMicroBatches = std::function<absl::StatusOr<EvalMetrics>(int n)>;

// Mean loss over up to `iters` micro-batches of `loader` (fewer when the
// split runs out), forward only: the batches are staged into the job's model
// and `evaluate` runs them, through the pipeline when there is one. The
// validation and test losses of a run and of tools/eval. Collective as
// `evaluate`.
absl::StatusOr<double> EvaluateLoss(Job& job, data::DataLoader* loader,
                                    int iters,
                                    const EvaluateMicroBatches& evaluate);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_EVALUATION_H_
