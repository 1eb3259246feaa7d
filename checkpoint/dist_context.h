#ifndef CHECKPOINT_DIST_CONTEXT_H_
#define CHECKPOINT_DIST_CONTEXT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace mcc {

// What checkpointing needs from the job's communication layer: this rank's
// place in the world and two collectives over every rank that saves or
// loads. The communication library (//core/comm) supplies an adapter; a
// single process uses DistContext::Single().
//
// Every rank must call the collectives in the same order. For asynchronous
// saves they are called from the saver's background thread, so they must be
// safe to call concurrently with the training thread's own collectives (use a
// separate process group, e.g. a gloo group over TCP).
struct DistContext {
  int rank = 0;
  int world_size = 1;
  // Returns once every rank has called it.
  std::function<absl::Status()> barrier;
  // Every rank contributes `mine`; every rank gets all contributions, indexed
  // by rank.
  std::function<absl::StatusOr<std::vector<std::string>>(
      const std::string& mine)>
      all_gather;
  // Optional (local checkpoints' peer copies): sends `mine` to rank `to`
  // and returns what rank `from` sent to this rank, refusing more than
  // max_bytes from it. Every rank calls it at once, each with its own
  // partner pair, so every send meets its receive.
  std::function<absl::StatusOr<std::string>(const std::string& mine, int to,
                                            int from, int64_t max_bytes)>
      send_recv;

  static DistContext Single();
};

// The most bytes one rank may contribute to a checkpoint all-gather (its
// manifest: a few hundred bytes a tensor shard).
inline constexpr int64_t kMaxAllGatherBytesPerRank = int64_t{1} << 30;

// Checks the byte counts ranks announce before an all-gather of strings
// allocates for them: each in [0, max_bytes_per_rank], and their total in
// 4-byte words within int64. DataLoss naming the first bad rank otherwise.
// Every rank sees the same counts, so every rank fails alike.
absl::Status CheckAllGatherSizes(
    const std::vector<int64_t>& sizes,
    int64_t max_bytes_per_rank = kMaxAllGatherBytesPerRank);

}  // namespace mcc

#endif  // CHECKPOINT_DIST_CONTEXT_H_
