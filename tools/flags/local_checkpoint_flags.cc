#include "tools/flags/local_checkpoint_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, non_persistent_ckpt_type, "",
          "Kind of non-persistent checkpoint (Megatron's flag): 'local' saves "
          "each rank's shard of the training state to "
          "--non-persistent-local-ckpt-dir every "
          "--non-persistent-save-interval iterations; a restart resumes from "
          "the newest one every rank can restore before --load's, when it "
          "is not older. Empty: none. ('global' and 'in_memory' are not "
          "implemented.)");
ABSL_FLAG(std::string, non_persistent_local_ckpt_dir, "",
          "Node-local directory (local disk or tmpfs) for "
          "--non-persistent-ckpt-type local; each rank writes rank_RRRRR/ "
          "under it, and replica_of_rank_SSSSS/ with --replication.");
ABSL_FLAG(int64_t, non_persistent_save_interval, 0,
          "Save a non-persistent checkpoint every this many iterations.");
ABSL_FLAG(bool, replication, false,
          "Also keep each rank's local checkpoint on a peer rank (rank + "
          "--replication-jump), which sends it back when the rank's own copy "
          "is lost or corrupt.");
ABSL_FLAG(int32_t, replication_jump, 0,
          "The distance from a rank to the peer keeping its local "
          "checkpoint (0: LOCAL_WORLD_SIZE, the same local rank on the next "
          "node, or the next rank when the job has one node).");
ABSL_FLAG(int32_t, replication_factor, 2,
          "Copies of each local checkpoint, the rank's own included; only 2 "
          "(one peer copy) is implemented.");
