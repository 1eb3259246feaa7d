#include "parallel/fsdp/sharding_strategy.h"

#include "absl/strings/str_cat.h"

namespace mcc {
namespace fsdp {

absl::string_view ShardingStrategyName(ShardingStrategy s) {
  switch (s) {
    case ShardingStrategy::kNoShard:
      return "no_shard";
    case ShardingStrategy::kOptim:
      return "optim";
    case ShardingStrategy::kOptimGrads:
      return "optim_grads";
    case ShardingStrategy::kOptimGradsParams:
      return "optim_grads_params";
  }
  return "unknown";
}

absl::StatusOr<ShardingStrategy> ParseShardingStrategy(absl::string_view name) {
  for (ShardingStrategy s :
       {ShardingStrategy::kNoShard, ShardingStrategy::kOptim,
        ShardingStrategy::kOptimGrads, ShardingStrategy::kOptimGradsParams}) {
    if (name == ShardingStrategyName(s)) return s;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--data-parallel-sharding-strategy: '", name,
      "' is not one of no_shard, optim, optim_grads, optim_grads_params"));
}

}  // namespace fsdp
}  // namespace mcc
