#ifndef CHECKPOINT_LOCAL_CHECKPOINT_H_
#define CHECKPOINT_LOCAL_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/dist_context.h"
#include "checkpoint/sharded_tensor.h"

namespace mcc {

// Local (non-persistent) checkpoints, as Megatron's
// --non-persistent-ckpt-type local: each rank saves its own shard of the
// training state to a node-local directory (local disk or tmpfs), often,
// and a copy goes to a peer rank on another node. A restart resumes from
// the newest iteration that every rank can restore, from its own copy or
// from its peer's, before the shared file system's checkpoint.
//
// Layout, under options.dir (each node has its own):
//   rank_00003/iter_0000100/           rank 3's shard (a one-rank checkpoint
//                                      of SaveCheckpoint's format)
//   rank_00003/iter_0000100.crc        its files' sizes and CRC32Cs; written
//                                      last (write-then-rename): a copy
//                                      without it is incomplete
//   replica_of_rank_00001/iter_.../    the copy this rank keeps for rank 1
//   replica_of_rank_00001/iter_....crc
struct LocalCheckpointOptions {
  // The node-local root directory.
  std::string dir;
  // Send a copy of each save to a peer rank (Megatron's --replication).
  bool replicate = false;
  // The peer of rank r is r + jump (mod world), its source r - jump
  // (Megatron's --replication-jump). 0: ranks_per_node when the job spans
  // several nodes (the same local rank on the next node), else 1 (the next
  // rank, on the same node: it survives a lost process, not a lost node).
  int replication_jump = 0;
  // Ranks on each node (the launcher's LOCAL_WORLD_SIZE); 0: unknown.
  int ranks_per_node = 0;
  // Iterations kept of each copy (own and replica). Two: a save killed
  // part-way on some ranks leaves the previous one complete everywhere.
  int keep = 2;
  // The most bytes a peer may send in one copy (checked before allocating).
  int64_t max_copy_bytes = int64_t{1} << 40;
  // Called after "saved" (own copy complete) and "replicated"; tests use
  // it to stop a save part-way.
  std::function<void(absl::string_view event)> progress_hook;
};

// The rank that keeps rank's replica (its peer), or -1 when options do not
// replicate or the world has one rank.
int LocalReplicaPeer(int rank, int world_size,
                     const LocalCheckpointOptions& options);

// Where to resume from: dir/iter_N, a complete checkpoint that
// CheckpointReader::Open(dir) (dir's tracker names N) or Open(dir, N) reads.
struct LocalRestore {
  int64_t iteration = 0;
  std::string dir;
  // This rank's own copy was missing or refused and came from its peer.
  bool from_peer = false;
  // Every copy of this rank refused while looking (own or held), each an
  // error naming its file.
  std::vector<std::string> refused;
};

class LocalCheckpointer {
 public:
  // dist: collectives over every rank of the job, on a group of their own;
  // with options.replicate it needs send_recv.
  static absl::StatusOr<std::unique_ptr<LocalCheckpointer>> Create(
      LocalCheckpointOptions options, DistContext dist);

  // Saves this rank's tensors and state as iteration `iteration` (a
  // one-rank checkpoint in rank_dir(), then its checksum file), then sends
  // the copy to the peer and keeps the one its source sends. Collective
  // (the exchange); every rank returns the same status.
  absl::Status Save(int64_t iteration,
                    const std::vector<ShardedTensorRef>& tensors,
                    const checkpoint::CommonState& common,
                    const checkpoint::RankState& rank_state);

  // Collective. Verifies every copy this rank holds (refused ones are
  // logged naming the file), agrees with every rank on the newest
  // iteration each can restore from its own copy or its peer's, fetches
  // missing copies from the peers, and points rank_dir()'s tracker at it.
  // Returns nullopt,
  // the same on every rank, when no such iteration exists, it is older
  // than `persistent_iteration` (the shared directory's newest), or a rank
  // could not write a fetched copy: then load the shared checkpoint. Copies
  // newer than where the run resumes (the local iteration, else
  // persistent_iteration, else 0) are removed: the run saves them again.
  absl::StatusOr<std::optional<LocalRestore>> PrepareRestore(
      std::optional<int64_t> persistent_iteration);

  // options.dir/rank_RRRRR.
  const std::string& rank_dir() const { return rank_dir_; }
  int peer() const { return peer_; }      // Keeps my replica; -1: none.
  int source() const { return source_; }  // Whose replica I keep; -1: none.

 private:
  LocalCheckpointer(LocalCheckpointOptions options, DistContext dist);
  void Hook(absl::string_view event) const;
  absl::Status Replicate(int64_t iteration);
  // Removes own and kept copies of iterations after `iteration`.
  absl::Status DropNewerThan(int64_t iteration);

  LocalCheckpointOptions options_;
  DistContext dist_;
  int peer_ = -1;
  int source_ = -1;
  std::string rank_dir_;
  std::string replica_dir_;  // Empty when not replicating.
};

// Checks one local copy: dir/iter_N.crc exists and lists each file of
// dir/iter_N with its size and CRC32C, and they match; its metadata names
// `rank` of `world_size`. DataLoss naming the file at fault.
absl::Status VerifyLocalCopy(const std::string& dir, int64_t iteration,
                             int rank, int world_size);

}  // namespace mcc

#endif  // CHECKPOINT_LOCAL_CHECKPOINT_H_
