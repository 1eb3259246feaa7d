#ifndef PARALLEL_FSDP_SHARDING_STRATEGY_H_
#define PARALLEL_FSDP_SHARDING_STRATEGY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace fsdp {

// What data-parallel ranks shard, as Megatron's
// --data-parallel-sharding-strategy names it (ZeRO stages in brackets).
enum class ShardingStrategy {
  kNoShard,           // "no_shard": plain DDP, everything replicated.
  kOptim,             // "optim": optimizer state and main params (ZeRO-1).
  kOptimGrads,        // "optim_grads": also gradients (ZeRO-2).
  kOptimGradsParams,  // "optim_grads_params": also parameters (ZeRO-3).
};

// Megatron's name of a strategy.
absl::string_view ShardingStrategyName(ShardingStrategy s);
// Parses Megatron's name; the error names the flag and the accepted values.
absl::StatusOr<ShardingStrategy> ParseShardingStrategy(absl::string_view name);

// Whether gradients (and, with the last, parameters) live in per-unit flat
// shards instead of whole per-parameter buffers.
inline bool ShardsGradients(ShardingStrategy s) {
  return s == ShardingStrategy::kOptimGrads ||
         s == ShardingStrategy::kOptimGradsParams;
}

}  // namespace fsdp
}  // namespace mcc

#endif  // PARALLEL_FSDP_SHARDING_STRATEGY_H_
