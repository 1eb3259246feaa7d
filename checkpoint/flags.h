#ifndef CHECKPOINT_FLAGS_H_
#define CHECKPOINT_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"

// Megatron's checkpoint flags (binaries translate --save-interval to
// --save_interval and so on).
ABSL_DECLARE_FLAG(std::string, save);
ABSL_DECLARE_FLAG(int64_t, save_interval);
ABSL_DECLARE_FLAG(std::string, load);
ABSL_DECLARE_FLAG(bool, async_save);
ABSL_DECLARE_FLAG(int32_t, keep_last);
ABSL_DECLARE_FLAG(bool, no_load_rng);
ABSL_DECLARE_FLAG(bool, no_load_optim);
ABSL_DECLARE_FLAG(bool, continue_on_save_failure);

namespace mcc {

struct CheckpointFlags {
  std::string save;  // Directory to save into; empty: never save.
  int64_t save_interval = 0;
  std::string load;  // Directory to resume from; empty: start fresh.
  bool async_save = false;
  int keep_last = 0;  // 0 keeps every checkpoint.
  bool no_load_rng = false;
  bool no_load_optim = false;
  // After a failed save: log it and train on (true), or stop (false).
  bool continue_on_save_failure = false;

  // Whether to save after `iteration` (also true at the last iteration when
  // saving is on).
  bool ShouldSave(int64_t iteration, int64_t train_iters) const;
};

// The flags' values, checked (a bad combination names the flags).
absl::StatusOr<CheckpointFlags> CheckpointFlagsFromCommandLine();

}  // namespace mcc

#endif  // CHECKPOINT_FLAGS_H_
