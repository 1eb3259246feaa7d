#ifndef CHECKPOINT_CHECKPOINT_WRITER_H_
#define CHECKPOINT_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/dist_context.h"
#include "checkpoint/sharded_tensor.h"

namespace mcc {

struct SaveOptions {
  // After a successful save, delete all but the newest keep_last complete
  // checkpoints (never the one `latest` names). 0 keeps all.
  int keep_last = 0;
  // Shards need not cover their tensors: each rank's own part, saved alone
  // (local checkpoints); readers read only the boxes saved.
  bool partial = false;
  // Alignment of each shard inside its file.
  int64_t alignment = 64;
  // Called on the saving thread after each step ("shard <name>" after each
  // shard is written, "files_synced", "metadata_written",
  // "old_moved_aside" when re-saving an iteration, after its old directory
  // was renamed to iter_N.old, "renaming" just before the directory's
  // rename, "committed");
  // tests use it to pause or kill a save part-way.
  std::function<void(absl::string_view event)> progress_hook;
  // Whether the chaos bench's MCC_CHAOS_KILL_AT_SAVE applies (it aims at
  // the shared saves; local checkpoints turn it off).
  bool chaos_kill = true;
};

// Saves one checkpoint of `iteration` under dir, collectively: every rank of
// dist calls it with its own shards (and RNG states in rank_state); the
// common state of rank 0 is stored.
//
// Shards held by several ranks (data-parallel replicas, replicated layer
// norms) are written once, by one of their holders, spreading the bytes
// evenly. Each rank writes its shards to iter_N.tmp/shard_rRRRRR.bin and
// fsyncs; rank 0 then writes metadata.pb, renames iter_N.tmp to iter_N and
// rewrites latest_checkpointed_iteration.txt (temporary file, fsync,
// rename). A save that dies part-way leaves the previous checkpoint and the
// latest file untouched; rank 0 removes what it left (RepairCheckpointDir)
// at the start of the next save. Every rank returns the same status; an
// error names the rank, file and tensor at fault.
absl::Status SaveCheckpoint(const std::string& dir, int64_t iteration,
                            const std::vector<ShardedTensorRef>& tensors,
                            const checkpoint::CommonState& common,
                            const checkpoint::RankState& rank_state,
                            const DistContext& dist,
                            const SaveOptions& options = {});

}  // namespace mcc

#endif  // CHECKPOINT_CHECKPOINT_WRITER_H_
