#ifndef INFERENCE_SCHEDULER_H_
#define INFERENCE_SCHEDULER_H_

// Continuous (in-flight) batching: which tokens of which sequences the next
// model step runs. At every step waiting requests join while the batch has
// room and the KV-cache pool has blocks for their whole length (so a running
// sequence never runs out); then the running sequences decode one token each
// (or, with recompute_prefix, their whole prefix) and unfinished prompts
// continue in chunks while the token budget lasts.

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "inference/model_runner.h"
#include "inference/paged_kv_cache.h"
#include "inference/sequence.h"

namespace mcc {
namespace inference {

struct SchedulerOptions {
  int max_batch_size = 8;           // Sequences in one step.
  int64_t prefill_chunk_size = 64;  // Prompt tokens of one sequence a step.
  int64_t max_tokens_per_step = 0;  // Token budget; 0: chunk + batch size.
  // Static batching (for comparison): a batch forms only when none runs,
  // and runs to completion.
  bool static_batching = false;
  // Full recompute (for comparison, eval --no-kv-cache): every decoding
  // step runs the sequence's whole prefix again, positions 0 to the newest,
  // instead of the newest token over the cached keys and values. The
  // recomputed keys and values overwrite the cached ones in place (the same
  // values: each row is computed alone), so only the newest row's logits are
  // used. A decoding sequence still counts one token against the budget.
  bool recompute_prefix = false;
  // Sliding-window attention (the model's window_left; -1: none): blocks
  // wholly behind every later query's window go back to the pool as the
  // sequence advances (not under recompute_prefix, which reads them again).
  int64_t window_left = -1;
  int64_t token_budget() const {
    return max_tokens_per_step > 0 ? max_tokens_per_step
                                   : prefill_chunk_size + max_batch_size;
  }
};

// Tokens [begin, begin + count) of one sequence in a step.
struct ScheduledSlice {
  Sequence* sequence = nullptr;
  int64_t begin = 0, count = 0;
};

struct StepPlan {
  std::vector<ScheduledSlice> slices;
  StepRows rows;  // Slice i's table is rows.tables[i].
  bool empty() const { return slices.empty(); }
};

// Owns the waiting and running sequences; allocates their blocks from
// `cache`. Not thread-safe (the engine thread).
class Scheduler {
 public:
  Scheduler(SchedulerOptions options, PagedKvCache* cache);

  void Add(std::unique_ptr<Sequence> sequence);
  // The next step (empty when nothing can run).
  StepPlan Plan();
  // Removes a running or waiting sequence, returning its blocks; the
  // sequence is destroyed.
  void Remove(Sequence* sequence);
  // Null when no sequence has that id.
  Sequence* Find(uint64_t id) const;

  // Every sequence, running then waiting.
  std::vector<Sequence*> All() const;
  int64_t waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t running() const { return static_cast<int64_t>(running_.size()); }
  const SchedulerOptions& options() const { return options_; }

 private:
  bool Admit(Sequence* sequence);

  SchedulerOptions options_;
  PagedKvCache* cache_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // Admission order.
};

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_SCHEDULER_H_
