#ifndef PARALLEL_DATA_PARALLEL_PARAM_GATHER_HOOKS_H_
#define PARALLEL_DATA_PARALLEL_PARAM_GATHER_HOOKS_H_

#include <vector>

#include "core/parameter.h"
#include "models/gpt/gpt_model.h"
#include "parallel/data_parallel/distributed_data_parallel.h"

namespace mcc {
namespace data_parallel {

// --overlap-param-gather: before each unit's forward, waits for the
// distributed optimizer's all-gathers of the buckets holding that unit's
// parameters only, so the rest keep arriving while the first layers
// compute (Megatron's forward pre-hook).
class ParamGatherHooks : public gpt::UnitHooks {
 public:
  ParamGatherHooks(DistributedDataParallel* ddp,
                   std::vector<ParameterList> units)
      : ddp_(ddp), units_(std::move(units)) {}

  absl::Status BeforeForward(int unit) override {
    return ddp_->WaitParamGather(units_[unit]);
  }
  absl::Status AfterForward(int) override { return absl::OkStatus(); }
  absl::Status BeforeBackward(int) override { return absl::OkStatus(); }
  absl::Status AfterBackward(int) override { return absl::OkStatus(); }

 private:
  DistributedDataParallel* ddp_;
  std::vector<ParameterList> units_;
};

}  // namespace data_parallel
}  // namespace mcc

#endif  // PARALLEL_DATA_PARALLEL_PARAM_GATHER_HOOKS_H_
