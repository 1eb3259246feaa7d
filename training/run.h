#ifndef TRAINING_RUN_H_
#define TRAINING_RUN_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "training/exit_conditions.h"
#include "training/job.h"
#include "training/train_config.pb.h"
#include "training/trainer.h"

namespace mcc {
namespace training {

// One whole training run, as Megatron-LM's pretrain_gpt runs it: joins the
// world the launcher's environment describes (or stays alone), builds the
// tokenizer, the GPT and its parallel layout, resumes from `load`, trains
// `train_iters` steps with evaluation, logging (metrics file, TensorBoard,
// straggler and pipeline reports, the profile window) and checkpoints, and
// evaluates the test split at the end. Every rank of the job calls it with
// the same config. tools/train is this call behind Megatron's flags:
//
//   training::TrainConfig config;   // every field defaults as its flag
//   config.set_num_layers(2);
//   config.set_train_iters(20);
//   config.set_save("/tmp/run");
//   auto exit = training::ExitConditions::Create(
//       *training::ExitOptionsFromConfig(config), absl::Now(), nullptr);
//   absl::Status s = training::Run(config, exit->get());
//
// `hooks` let a caller see each stage of the run as it happens and add its
// own work there (logging to its own system, checks, copying checkpoints);
// an error from a hook stops the run with that error. Every rank calls its
// hooks at the same points.
//
// `exit_conditions` decides early stops (signals, wall clock, intervals):
// create it as early as the process starts, so that its clock and signal
// handler cover set-up too; Run gives it the world. Check the config first
// with CheckTrainConfig (run_options.h) for errors that name flags.
struct RunHooks {
  // Set-up done: the world, groups, model, optimizer and trainer exist and
  // the run has resumed; `first_iteration` is the next step's number.
  std::function<absl::Status(Job& job, Trainer& trainer,
                             int64_t first_iteration)>
      after_setup;
  // A step done (after the run's own logging and checks for it).
  std::function<absl::Status(const StepMetrics& step)> after_step;
  // A validation evaluation done at `iteration` (eval_interval).
  std::function<absl::Status(int64_t iteration, double loss)> after_evaluation;
  // A checkpoint of `iteration` saved (or, with async_save, handed to the
  // background writer) under `dir`.
  std::function<absl::Status(int64_t iteration, const std::string& dir)>
      after_save;
};

absl::Status Run(const TrainConfig& config, ExitConditions* exit_conditions,
                 const RunHooks& hooks = {});

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_RUN_H_
