#ifndef TRAINING_RUN_H_
#define TRAINING_RUN_H_

#include "absl/status/status.h"
#include "training/exit_conditions.h"
#include "training/train_config.pb.h"

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
// `exit_conditions` decides early stops (signals, wall clock, intervals):
// create it as early as the process starts, so that its clock and signal
// handler cover set-up too; Run gives it the world. Check the config first
// with CheckTrainConfig (run_options.h) for errors that name flags.
absl::Status Run(const TrainConfig& config, ExitConditions* exit_conditions);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_RUN_H_
