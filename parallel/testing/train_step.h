#ifndef PARALLEL_TESTING_TRAIN_STEP_H_
#define PARALLEL_TESTING_TRAIN_STEP_H_

// The parts of a training step around its micro-batches, in the order
// parallel/model.h and parallel/data_parallel/data_parallel.h give them, for
// tests of the parallel libraries that drive the engine by hand
// (training::Trainer sits in a higher layer). A test runs
//   BeginTrainStep, its micro-batches (a pipeline executor's Run, or the
//   model's own forward and backward), FinishTrainStep.
// `data_parallel` wraps `models` (DDP or FSDP), or is null: then each model
// keeps its own gradients (a serial run, or one rank's pipeline chunks).
// Both are collective where the calls they make are.

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/model.h"

namespace mcc {
namespace parallel {
namespace testing {

// The wrapper's FinishParamGather and ZeroGrads, or each model's
// ZeroGradients.
absl::Status BeginTrainStep(data_parallel::DataParallel* data_parallel,
                            absl::Span<Model* const> models);

// Each model's SyncSharedGradients (without an embedding group), then the
// wrapper's FinishGradSync and FinalizeGradients (or each model's
// FinalizeGradients), then the optimizer's step at `lr`.
absl::StatusOr<optim::StepInfo> FinishTrainStep(
    data_parallel::DataParallel* data_parallel, absl::Span<Model* const> models,
    optim::Optimizer& optimizer, double lr);

}  // namespace testing
}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_TESTING_TRAIN_STEP_H_
