#include "tools/flags/checkpoint_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, save, "",
          "Directory to save checkpoints in (iter_NNNNNNN/ per save).");
ABSL_FLAG(int64_t, save_interval, 0,
          "Save a checkpoint every this many iterations (needs --save).");
ABSL_FLAG(std::string, load, "",
          "Directory to load the latest checkpoint from "
          "(latest_checkpointed_iteration.txt names it). A directory with no "
          "checkpoint is an error (exit 2), unless it is also --save: then "
          "the run starts fresh and a restart resumes there (auto-resume, "
          "as tools/launch --max-restarts needs). An unreadable tracker, or "
          "one naming a missing or incomplete iter_N, is always an error.");
ABSL_FLAG(bool, async_save, false,
          "Copy tensors to host memory and write them in a background thread "
          "while training continues.");
ABSL_FLAG(int32_t, keep_last, 0,
          "Keep only the newest K checkpoints under --save (0: keep all).");
ABSL_FLAG(bool, no_load_rng, false, "Do not restore RNG states on load.");
ABSL_FLAG(bool, no_load_optim, false,
          "Do not restore optimizer state on load.");
ABSL_FLAG(bool, continue_on_save_failure, false,
          "When a checkpoint save fails (a full disk, an I/O error; with "
          "--async-save it is noticed at the next save or at the end), log "
          "the error and keep training instead of stopping. Either way the "
          "previous checkpoint and the latest file stay intact.");
