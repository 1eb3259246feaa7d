#include "parallel/data_parallel/hybrid_sharding.h"

#include "absl/strings/str_cat.h"

namespace mcc {
namespace data_parallel {

absl::Status CheckHybridSharding(const HybridSharding& hybrid,
                                 comm::ProcessGroup* dp, bool shards_state) {
  if (!hybrid.enabled() && hybrid.cross_instance == nullptr) {
    return absl::OkStatus();
  }
  if (!shards_state) {
    return absl::InvalidArgumentError(
        "--num-distributed-optimizer-instances above 1 needs sharded "
        "optimizer state (--use-distributed-optimizer or "
        "--data-parallel-sharding-strategy optim, optim_grads or "
        "optim_grads_params)");
  }
  const int dp_size = dp == nullptr ? 1 : dp->size();
  if (hybrid.instance == nullptr || hybrid.cross_instance == nullptr ||
      hybrid.instance->size() * hybrid.cross_instance->size() != dp_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-distributed-optimizer-instances: an instance of ",
        hybrid.instance ? hybrid.instance->size() : 0, " ranks times ",
        hybrid.cross_instance ? hybrid.cross_instance->size() : 0,
        " instances is not the data-parallel group's ", dp_size, " ranks"));
  }
  return absl::OkStatus();
}

absl::Status CheckExpertHybridSharding(const HybridSharding& hybrid,
                                       comm::ProcessGroup* expert_data) {
  if (!hybrid.enabled()) return absl::OkStatus();
  const int edp = expert_data == nullptr ? 1 : expert_data->size();
  const int in = hybrid.expert_instance ? hybrid.expert_instance->size() : 0;
  const int across =
      hybrid.expert_cross_instance ? hybrid.expert_cross_instance->size() : 0;
  if (in * across != edp) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-distributed-optimizer-instances with expert weights: an "
        "expert instance of ",
        in, " ranks times ", across,
        " instances is not the expert-data-parallel group's ", edp,
        " ranks (HybridSharding::expert_instance / expert_cross_instance)"));
  }
  return absl::OkStatus();
}

}  // namespace data_parallel
}  // namespace mcc
