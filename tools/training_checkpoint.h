#ifndef TOOLS_TRAINING_CHECKPOINT_H_
#define TOOLS_TRAINING_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/async_saver.h"
#include "checkpoint/dist_context.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "tools/job.h"

namespace mcc {
namespace tools {

// What a training run resumes from besides the tensors.
struct TrainingProgress {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
};

// Saves the model (and the optimizer's state, when given) as global
// tensors: every TP piece is a box of the full tensor, and the distributed
// optimizer's shards are gathered over DP into whole local tensors first, so
// any layout can load the result. Collective over the world. With `async`,
// tensors are copied and written in the background.
absl::Status SaveTrainingCheckpoint(const std::string& dir, const Job& job,
                                    optim::Optimizer* optimizer,
                                    const optim::LrSchedule& schedule,
                                    const TrainingProgress& progress,
                                    const DistContext& dist,
                                    AsyncCheckpointSaver* async, int keep_last);

// Loads the model from the latest checkpoint in dir, under this job's
// layout, after checking that the stored model configuration equals this
// run's. Call before building data parallelism and the optimizer, which
// take their fp32 copies from the loaded weights.
absl::StatusOr<TrainingProgress> LoadModelCheckpoint(const std::string& dir,
                                                     Job& job, bool load_rng);

// Loads the optimizer's state (moments, fp32 main parameters, step count,
// loss scale) saved by SaveTrainingCheckpoint, resharded to this layout.
absl::Status LoadOptimizerCheckpoint(const std::string& dir, const Job& job,
                                     optim::Optimizer* optimizer);

}  // namespace tools
}  // namespace mcc

#endif  // TOOLS_TRAINING_CHECKPOINT_H_
