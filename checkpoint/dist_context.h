#ifndef CHECKPOINT_DIST_CONTEXT_H_
#define CHECKPOINT_DIST_CONTEXT_H_

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

  static DistContext Single();
};

}  // namespace mcc

#endif  // CHECKPOINT_DIST_CONTEXT_H_
