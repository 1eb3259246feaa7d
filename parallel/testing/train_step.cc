#include "parallel/testing/train_step.h"

#include "core/status_macros.h"

namespace mcc {
namespace parallel {
namespace testing {

absl::Status BeginTrainStep(data_parallel::DataParallel* data_parallel,
                            absl::Span<Model* const> models) {
  if (data_parallel != nullptr) {
    MCC_RETURN_IF_ERROR(data_parallel->FinishParamGather());
    data_parallel->ZeroGrads();
    return absl::OkStatus();
  }
  for (Model* m : models) m->ZeroGradients();
  return absl::OkStatus();
}

absl::StatusOr<optim::StepInfo> FinishTrainStep(
    data_parallel::DataParallel* data_parallel, absl::Span<Model* const> models,
    optim::Optimizer& optimizer, double lr) {
  for (Model* m : models) MCC_RETURN_IF_ERROR(m->SyncSharedGradients(nullptr));
  if (data_parallel != nullptr) {
    MCC_RETURN_IF_ERROR(data_parallel->FinishGradSync());
    MCC_RETURN_IF_ERROR(data_parallel->FinalizeGradients());
  } else {
    for (Model* m : models) MCC_RETURN_IF_ERROR(m->FinalizeGradients());
  }
  return optimizer.Step(lr);
}

}  // namespace testing
}  // namespace parallel
}  // namespace mcc
