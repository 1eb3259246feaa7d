#ifndef INFERENCE_DISTRIBUTED_STEP_H_
#define INFERENCE_DISTRIBUTED_STEP_H_

// Steps across the ranks of a tensor- and pipeline-parallel job. World rank 0
// plans (the engine) and broadcasts each step's rows; every rank runs its
// stage (TP ranks together); hidden states go stage to stage; the last
// stage's first TP rank sends the logits back to rank 0. The other ranks
// follow in FollowSteps until rank 0 shuts them down. Any failed collective
// (a dead rank) is an error on every rank that waits on it, within the
// groups' timeout: never a hang.

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "inference/model_runner.h"
#include "inference/step_executor.h"

namespace mcc {
namespace inference {

// Where this rank sits. `world` spans the job (size tp * pp, rank 0 plans);
// `pipeline` (null without PP) orders the stages of this rank's TP index.
struct StageLayout {
  comm::ProcessGroup* world = nullptr;
  comm::ProcessGroup* pipeline = nullptr;
  int pp_rank = 0, pp_size = 1;
  int tp_rank = 0;
};

// On world rank 0.
class DistributedStepExecutor : public StepExecutor {
 public:
  DistributedStepExecutor(ModelRunner* runner, StageLayout layout)
      : runner_(runner), layout_(layout) {}
  absl::StatusOr<std::vector<float>> Execute(const StepRows& rows) override;
  absl::Status Idle() override;
  absl::Status Shutdown() override;

 private:
  ModelRunner* runner_;
  StageLayout layout_;
};

// The executor world rank 0 hands its engine: the whole model in this
// process without a world (LocalStepExecutor), else the job's ranks
// (DistributedStepExecutor; the others run FollowSteps).
std::unique_ptr<StepExecutor> MakeStepExecutor(ModelRunner* runner,
                                               const StageLayout& layout);

// On every other rank: runs the steps rank 0 broadcasts until it shuts
// down (OK) or a collective fails (the error, naming the operation).
absl::Status FollowSteps(ModelRunner* runner, const StageLayout& layout);

// The step's rows as int64 words and back (the broadcast's payload).
std::vector<int64_t> SerializeRows(const StepRows& rows);
absl::StatusOr<StepRows> DeserializeRows(const std::vector<int64_t>& words);

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_DISTRIBUTED_STEP_H_
