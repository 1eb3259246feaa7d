#include "training/local_checkpointing.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/comm_dist_context.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "training/run_options.h"

namespace mcc {
namespace training {

absl::StatusOr<LocalTrainingCheckpoints> StartLocalCheckpoints(
    const TrainConfig& config, Job& job, const std::string& load) {
  LocalTrainingCheckpoints out;
  MCC_ASSIGN_OR_RETURN(LocalCheckpointSettings f,
                       LocalCheckpointSettingsFromConfig(config));
  if (!f.enabled) return out;
  f.options.ranks_per_node = job.local_world_size;
  if (job.world.has_value() && job.world_size > 1) {
    std::vector<int> all(job.world_size);
    for (int r = 0; r < job.world_size; ++r) all[r] = r;
    MCC_ASSIGN_OR_RETURN(out.group, job.world->group->NewSubgroup(all));
  }
  out.dist = MakeProcessGroupDistContext(out.group.get());
  out.save_interval = f.save_interval;
  const int peer = LocalReplicaPeer(job.rank, job.world_size, f.options);
  if (job.is_logging_rank()) {
    LOG(INFO) << "local checkpoints every " << f.save_interval
              << " iterations in " << f.options.dir
              << (peer < 0
                      ? ", not replicated"
                      : absl::StrCat(", rank 0's also kept by rank ", peer,
                                     f.options.replication_jump > 0
                                         ? " (--replication-jump)"
                                     : job.world_size > job.local_world_size
                                         ? " (on the next node)"
                                         : " (the next rank, on "
                                           "this node)"));
  }
  MCC_ASSIGN_OR_RETURN(out.checkpointer,
                       LocalCheckpointer::Create(f.options, out.dist));
  std::optional<int64_t> shared;
  if (!load.empty()) {
    MCC_ASSIGN_OR_RETURN(std::optional<CheckpointLocation> at,
                         FindCheckpointToLoad(load));
    if (at.has_value()) shared = at->iteration;
  }
  MCC_ASSIGN_OR_RETURN(std::optional<LocalRestore> restore,
                       out.checkpointer->PrepareRestore(shared));
  if (restore.has_value()) out.restore_dir = restore->dir;
  return out;
}

}  // namespace training
}  // namespace mcc
