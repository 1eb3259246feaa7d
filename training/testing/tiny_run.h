#ifndef TRAINING_TESTING_TINY_RUN_H_
#define TRAINING_TESTING_TINY_RUN_H_

// The whole training run (training::Run) on a tiny GPT, for the tests of
// what a run does end to end (hooks, resume, fine-tuning, checkpoints,
// evaluation of what it saved).

#include <string>

#include "absl/status/status.h"
#include "training/run.h"
#include "training/train_config.pb.h"

namespace mcc {
namespace training {
namespace testing {

// 2 layers, hidden 16, 2 heads, vocabulary 64, sequence 16, micro-batch 2,
// global batch 4, 6 iterations on mock data, logged every step, no
// evaluation, one thread on the CPU. Creates `dir` (for the caller's
// save / metrics paths under it).
TrainConfig TinyRunConfig(const std::string& dir);

// training::Run with the config's exit conditions.
absl::Status RunTiny(const TrainConfig& config, const RunHooks& hooks = {});

}  // namespace testing
}  // namespace training
}  // namespace mcc

#endif  // TRAINING_TESTING_TINY_RUN_H_
