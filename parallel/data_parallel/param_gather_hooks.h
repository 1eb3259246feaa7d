#ifndef PARALLEL_DATA_PARALLEL_PARAM_GATHER_HOOKS_H_
#define PARALLEL_DATA_PARALLEL_PARAM_GATHER_HOOKS_H_

#include <vector>

#include "absl/strings/str_cat.h"
#include "core/parameter.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/model.h"

namespace mcc {
namespace data_parallel {

// --overlap-param-gather: before each unit's forward, waits for the
// distributed optimizer's all-gathers of the buckets holding that unit's
// parameters only, so the rest keep arriving while the first layers
// compute (Megatron's forward pre-hook). Install on a model with
// Model::AddUnitHooks (alongside any other hooks); `ddp` is not owned and
// must outlive the installation.
class ParamGatherHooks : public parallel::UnitHooks {
 public:
  ParamGatherHooks(DistributedDataParallel* ddp,
                   std::vector<ParameterList> units)
      : ddp_(ddp), units_(std::move(units)) {}
  // For `model`'s units.
  ParamGatherHooks(DistributedDataParallel* ddp, const parallel::Model& model)
      : ParamGatherHooks(ddp, model.units()) {}

  absl::Status BeforeForward(int unit) override {
    if (unit < 0 || unit >= static_cast<int>(units_.size())) {
      return absl::OutOfRangeError(absl::StrCat("ParamGatherHooks: unit ", unit,
                                                " of a model with ",
                                                units_.size(), " units"));
    }
    return ddp_->WaitParamGather(units_[unit]);
  }

 private:
  DistributedDataParallel* ddp_;
  std::vector<ParameterList> units_;
};

}  // namespace data_parallel
}  // namespace mcc

#endif  // PARALLEL_DATA_PARALLEL_PARAM_GATHER_HOOKS_H_
