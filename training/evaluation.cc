#include "training/evaluation.h"

#include <utility>
#include <vector>

#include "core/status_macros.h"
#include "training/model_batch.h"

namespace mcc {
namespace training {

absl::StatusOr<double> EvaluateLoss(Job& job, data::DataLoader* loader,
                                    int iters,
                                    const EvaluateMicroBatches& evaluate) {
  std::vector<gpt::MicroBatch> batches;
  for (int i = 0; i < iters; ++i) {
    auto mb = loader->Next();
    if (absl::IsOutOfRange(mb.status())) break;
    MCC_RETURN_IF_ERROR(mb.status());
    batches.push_back(ModelBatchOf(*mb, loader->config()));
  }
  const int n = static_cast<int>(batches.size());
  MCC_RETURN_IF_ERROR(job.model->SetMicroBatches(std::move(batches)));
  MCC_ASSIGN_OR_RETURN(EvalMetrics eval, evaluate(n));
  return eval.loss;
}

}  // namespace training
}  // namespace mcc
