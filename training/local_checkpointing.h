#ifndef TRAINING_LOCAL_CHECKPOINTING_H_
#define TRAINING_LOCAL_CHECKPOINTING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/dist_context.h"
#include "checkpoint/local_checkpoint.h"
#include "core/comm/process_group.h"
#include "training/job.h"
#include "training/train_config.pb.h"

namespace mcc {
namespace training {

// train's --non-persistent-ckpt-type local: the checkpointer (over a
// process group of its own) and where the run resumes from.
struct LocalTrainingCheckpoints {
  std::unique_ptr<LocalCheckpointer> checkpointer;  // Null when off.
  std::shared_ptr<comm::ProcessGroup> group;
  DistContext dist;
  int64_t save_interval = 0;
  // The directory to load instead of --load (this rank's local copy), or
  // empty: load --load as before.
  std::string restore_dir;

  bool Due(int64_t iteration) const {
    return checkpointer != nullptr && iteration % save_interval == 0;
  }
};

// Reads the config's non_persistent_* and replication* settings and, when
// local checkpoints are on, restores (collectively): `load` is --load when the
// run resumes from it, else empty; the local copies win when they are at least
// as new as its checkpoint.
absl::StatusOr<LocalTrainingCheckpoints> StartLocalCheckpoints(
    const TrainConfig& config, Job& job, const std::string& load);

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_LOCAL_CHECKPOINTING_H_
