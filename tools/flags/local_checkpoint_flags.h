#ifndef TOOLS_FLAGS_LOCAL_CHECKPOINT_FLAGS_H_
#define TOOLS_FLAGS_LOCAL_CHECKPOINT_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

// Megatron-LM's non-persistent (local) checkpoint flags; a run reads them
// through its TrainConfig (training/run_options.h: LocalCheckpointSettings).
ABSL_DECLARE_FLAG(std::string, non_persistent_ckpt_type);
ABSL_DECLARE_FLAG(std::string, non_persistent_local_ckpt_dir);
ABSL_DECLARE_FLAG(int64_t, non_persistent_save_interval);
ABSL_DECLARE_FLAG(bool, replication);
ABSL_DECLARE_FLAG(int32_t, replication_jump);
ABSL_DECLARE_FLAG(int32_t, replication_factor);

#endif  // TOOLS_FLAGS_LOCAL_CHECKPOINT_FLAGS_H_
