#ifndef CHECKPOINT_CHECKPOINT_DIR_H_
#define CHECKPOINT_CHECKPOINT_DIR_H_

#include <cstdint>
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

}  // namespace mcc

#endif  // CHECKPOINT_CHECKPOINT_DIR_H_
