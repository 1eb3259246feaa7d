#ifndef CHECKPOINT_CHECKPOINT_DIR_H_
#define CHECKPOINT_CHECKPOINT_DIR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace mcc {

// Layout of a save directory:
//   DIR/latest_checkpointed_iteration.txt   "100\n" once iter 100 is complete
//   DIR/iter_0000100/metadata.pb            CheckpointMetadata
//   DIR/iter_0000100/shard_r00003.bin       shards written by rank 3
//   DIR/iter_0000200.tmp/                   a save in progress (or killed)
inline constexpr char kLatestFileName[] = "latest_checkpointed_iteration.txt";
inline constexpr char kMetadataFileName[] = "metadata.pb";
inline constexpr int kFormatVersion = 1;

std::string IterationDirName(int64_t iteration);  // "iter_0000100"
std::string ShardFileName(int rank);              // "shard_r00003.bin"

// The iteration named by DIR/latest_checkpointed_iteration.txt; NotFound
// when the file does not exist.
absl::StatusOr<int64_t> LatestIteration(const std::string& dir);

// Complete checkpoints (iter_NNNNNNN directories holding metadata.pb) in
// increasing order of iteration.
std::vector<int64_t> ListCheckpoints(const std::string& dir);

// A checkpoint to load: DIR/iter_N, or DIR/iter_N.old when a re-save of
// iteration N died between moving the old copy aside and renaming the new
// one in (RepairCheckpointDir moves it back).
struct CheckpointLocation {
  int64_t iteration = 0;
  std::string path;
};

// Where the checkpoint of `iteration` in dir is: DIR/iter_N when it is
// complete (holds metadata.pb); DIR/iter_N.old, logged, when iter_N does
// not exist and iter_N.old is complete; else DataLoss naming iter_N (and
// `tracker`, what named the iteration, when not empty). Reads only.
absl::StatusOr<CheckpointLocation> LocateCheckpoint(
    const std::string& dir, int64_t iteration, const std::string& tracker = "");

// The checkpoint DIR's tracker (latest_checkpointed_iteration.txt) names,
// checked. Reads only. Returns
//  - nullopt when dir holds no checkpoint at all: no tracker and no complete
//    iter_N or iter_N.old (dir need not exist);
//  - an error naming the tracker when it cannot be read or holds no
//    iteration number, or is missing while complete checkpoints exist (a
//    fresh start there would overwrite them);
//  - LocateCheckpoint's error when the named iteration is missing or
//    incomplete.
// Never a fresh start for a tracker that is there but unusable.
absl::StatusOr<std::optional<CheckpointLocation>> FindCheckpointToLoad(
    const std::string& dir);

// Whether a run with these --load and --save directories resumes from a
// checkpoint in `load`: false when load is empty, or holds no checkpoint at
// all and is also the save directory (the auto-resume idiom: the first start
// of a job that tools/launch --max-restarts restarts; logged when `log`);
// true when FindCheckpointToLoad finds one. NotFound, saying so, when load
// holds no checkpoint and is not the save directory; FindCheckpointToLoad's
// other errors as they are.
absl::StatusOr<bool> ShouldResume(const std::string& load,
                                  const std::string& save, bool log);

// Whether two paths name the same directory (after resolving symlinks and
// dropping trailing slashes; neither needs to exist).
bool SameDirectory(const std::string& a, const std::string& b);

// Undoes what a writer that died left in dir: removes iter_N.tmp/
// directories and the tracker's temporary file; for each iter_N.old,
// removes it when iter_N is complete, or renames it back to iter_N when
// iter_N does not exist and it is complete. Each change is logged.
// Only the writer may call it (rank 0 at the start of a save, or before a
// run that saves into its --load directory loads anything): it removes
// temporaries, so no other save into dir may be in progress.
absl::Status RepairCheckpointDir(const std::string& dir);

}  // namespace mcc

#endif  // CHECKPOINT_CHECKPOINT_DIR_H_
