#ifndef TRAINING_CHECKPOINTING_H_
#define TRAINING_CHECKPOINTING_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/async_saver.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/dist_context.h"
#include "checkpoint/local_checkpoint.h"
#include "checkpoint/sharded_tensor.h"
#include "core/parameter.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "training/job.h"

namespace mcc {
namespace training {

// What a training run resumes from besides the tensors.
struct TrainingProgress {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0;
};

// The box of the global tensor `name` that a parameter's local tensor
// (its value, or optimizer state shaped like it) holds in checkpoints. A
// vocabulary-padded parameter (Parameter::unpadded_rows) is stored with the
// model's rows only, so the padding of the saving layout never shows;
// nullopt when this rank holds only padding rows.
std::optional<ShardedTensorRef> ParameterRef(const std::string& name,
                                             const Parameter& p,
                                             const Tensor& local);

// Every box a parameter's local tensor holds: ParameterRef's (none when
// the rank holds only padding rows) or, for an expert weight sliced over
// expert tensor parallelism, its pieces of the full [E, ...] tensor, which
// holds every expert whole so that any EP/ETP layout loads it. SwiGLU's fc1
// [E, 2f, h] keeps gate and up stacked (as Hugging Face import and the
// inference engine read it), so its ETP piece is one box per local expert
// and block, rows [b f + q f / ETP, b f + (q + 1) f / ETP) of block b, each
// a view of the local tensor.
absl::StatusOr<std::vector<ShardedTensorRef>> ParameterRefs(
    const std::string& name, const Parameter& p, const Tensor& local);

// Reads ref's box. With vocab_padded, also from checkpoints written before
// the padding left the model (their vocabulary tensors hold the padded
// rows, which are skipped).
absl::Status LoadParameterRef(CheckpointReader& reader,
                              const ShardedTensorRef& ref, bool vocab_padded);

// Loads every parameter's box from the checkpoint, under any layout and any
// vocabulary padding (padding rows keep their zeros).
absl::Status LoadParameters(CheckpointReader& reader,
                            const ParameterList& params);

// Saves the model (and the optimizer's state, when given) as global
// tensors: every TP piece is a box of the full tensor, and the distributed
// optimizer's shards are gathered over DP into whole local tensors first, so
// any layout can load the result. Collective over the world. With `async`,
// tensors are copied and written in the background. With `local`, the same
// state goes to this rank's local checkpoint instead (dir is unused).
absl::Status SaveTrainingCheckpoint(const std::string& dir, const Job& job,
                                    optim::Optimizer* optimizer,
                                    const optim::LrSchedule& schedule,
                                    const TrainingProgress& progress,
                                    const DistContext& dist,
                                    AsyncCheckpointSaver* async, int keep_last,
                                    LocalCheckpointer* local = nullptr);

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

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_CHECKPOINTING_H_
