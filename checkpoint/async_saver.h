#ifndef CHECKPOINT_ASYNC_SAVER_H_
#define CHECKPOINT_ASYNC_SAVER_H_

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/dist_context.h"
#include "checkpoint/sharded_tensor.h"

namespace mcc {

// --async-save: Start() copies the shards into host buffers (reused from one
// save to the next when shapes match) and returns; a background thread then
// runs SaveCheckpoint while training goes on. One save is in flight at a
// time: Start() first waits for the previous one.
//
// The DistContext's collectives are called from the background thread (see
// dist_context.h).
class AsyncCheckpointSaver {
 public:
  AsyncCheckpointSaver() = default;
  ~AsyncCheckpointSaver();  // Waits for the save in flight.
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;

  // Returns the previous save's error, if it failed (the new save still
  // starts), or an error copying the tensors (then nothing starts).
  absl::Status Start(const std::string& dir, int64_t iteration,
                     const std::vector<ShardedTensorRef>& tensors,
                     const checkpoint::CommonState& common,
                     const checkpoint::RankState& rank_state,
                     const DistContext& dist, const SaveOptions& options = {});
  // Waits for the save in flight (if any) and returns its status.
  absl::Status Wait();
  // A save was started and not yet waited for (it may have finished).
  bool in_flight() const { return thread_.joinable(); }
  // Iteration of the save in flight or last finished; -1 before any.
  int64_t iteration() const { return iteration_; }

 private:
  std::thread thread_;
  absl::Status status_;
  int64_t iteration_ = -1;
  std::vector<ShardedTensorRef> host_;  // Host copies, reused.
};

}  // namespace mcc

#endif  // CHECKPOINT_ASYNC_SAVER_H_
