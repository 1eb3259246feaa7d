#ifndef TOOLS_FLAGS_CHECKPOINT_FLAGS_H_
#define TOOLS_FLAGS_CHECKPOINT_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

// Megatron's checkpoint flags (binaries translate --save-interval to
// --save_interval and so on); a run reads them through its TrainConfig
// (training/run_options.h: CheckpointOptions).
ABSL_DECLARE_FLAG(std::string, save);
ABSL_DECLARE_FLAG(int64_t, save_interval);
ABSL_DECLARE_FLAG(std::string, load);
ABSL_DECLARE_FLAG(bool, async_save);
ABSL_DECLARE_FLAG(int32_t, keep_last);
ABSL_DECLARE_FLAG(bool, no_load_rng);
ABSL_DECLARE_FLAG(bool, no_load_optim);
ABSL_DECLARE_FLAG(bool, continue_on_save_failure);

#endif  // TOOLS_FLAGS_CHECKPOINT_FLAGS_H_
