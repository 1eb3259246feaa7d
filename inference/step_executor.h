#ifndef INFERENCE_STEP_EXECUTOR_H_
#define INFERENCE_STEP_EXECUTOR_H_

// How the engine runs a planned step: alone (LocalStepExecutor) or across the
// ranks of a tensor- and pipeline-parallel job (distributed_step.h).

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference/model_runner.h"

namespace mcc {
namespace inference {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Runs the rows through the whole model; returns the logits of
  // rows.logit_rows, fp32 [logit rows, vocab_size]. An error is final: the
  // engine stops.
  virtual absl::StatusOr<std::vector<float>> Execute(const StepRows& rows) = 0;
  // Called when the engine has had nothing to run for a while (keeps
  // waiting ranks from timing out).
  virtual absl::Status Idle() { return absl::OkStatus(); }
  // The engine stops: other ranks may leave.
  virtual absl::Status Shutdown() { return absl::OkStatus(); }
};

// The whole model in this process (or every rank of a TP group running the
// same rows: see ModelRunner).
class LocalStepExecutor : public StepExecutor {
 public:
  explicit LocalStepExecutor(ModelRunner* runner) : runner_(runner) {}
  absl::StatusOr<std::vector<float>> Execute(const StepRows& rows) override {
    std::vector<float> hidden;
    return runner_->Run(rows, &hidden);
  }

 private:
  ModelRunner* runner_;
};

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_STEP_EXECUTOR_H_
