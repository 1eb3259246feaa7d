#ifndef TRAINING_TESTING_FSDP_TEST_UTIL_H_
#define TRAINING_TESTING_FSDP_TEST_UTIL_H_

// The tests' tiny training loop (train_test_util.h) with the
// model wrapped by FullyShardedDataParallel, a start step, and whole
// parameters and optimizer state loaded before / saved after training.

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "parallel/fsdp/checkpoint_interop.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/parallel_state.h"
#include "training/testing/train_test_util.h"

namespace mcc {
namespace fsdp {
namespace testing {

struct FsdpTrainOptions {
  // Model, dtype, SP, optimizer, LR, steps and global batch (use_ddp and
  // ddp are ignored).
  optim::testing::TrainOptions base;
  bool use_fsdp = true;  // False: model and plain optimizer (serial).
  FsdpConfig fsdp;
  int start_step = 0;  // Index of the first step (its batches and LR).
  // Whole tensors (WriteTensors' format, one file per TP rank: path +
  // ".tp<r>") loaded before the first step / written after the last.
  std::string load_path;
  std::string save_path;
  // Called after every optimizer step.
  std::function<absl::Status(int step, data_parallel::DataParallel*)>
      after_step;
  // Called once the optimizer exists (may be null): for tests that measure
  // its state.
  std::function<void(const optim::Optimizer&)> on_optimizer;
};

absl::StatusOr<optim::testing::TrainResult> TrainFsdp(
    const FsdpTrainOptions& options, parallel::ParallelState* state);

// Whole tensors to and from a file (fp32 on disk).
absl::Status WriteTensors(const std::string& path,
                          const TrainingTensors& tensors);
absl::StatusOr<TrainingTensors> ReadTensors(const std::string& path);

// The options the parity tests share (AdamW, clipping that acts on some
// steps, cosine LR with warm-up; 10 steps, 4 micro-batches of 2).
optim::testing::TrainOptions ParityOptions();

}  // namespace testing
}  // namespace fsdp
}  // namespace mcc

#endif  // TRAINING_TESTING_FSDP_TEST_UTIL_H_
