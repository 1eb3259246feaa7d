#ifndef CHECKPOINT_SAVE_PLAN_H_
#define CHECKPOINT_SAVE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/checkpoint.pb.h"

namespace mcc {

// One distinct shard of a global tensor and the rank chosen to write it.
struct PlannedShard {
  std::string name;
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  std::vector<int> holders;  // Ranks holding an identical copy, ascending.
  int writer = -1;
};

// From every rank's manifest (what each holds), checks that the ranks agree
// on each tensor's global shape and dtype, that distinct shards do not
// overlap and together cover the tensor, and picks one writer per distinct
// shard so that bytes spread evenly over the holders. Deterministic: every
// rank computes the same plan from the same manifests. Without
// require_cover, shards may leave parts of a tensor out (a rank's own part,
// saved alone: local checkpoints).
absl::StatusOr<std::vector<PlannedShard>> PlanSave(
    const std::vector<checkpoint::RankManifest>& manifests,
    bool require_cover = true);

}  // namespace mcc

#endif  // CHECKPOINT_SAVE_PLAN_H_
