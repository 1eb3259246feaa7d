#ifndef INFERENCE_ENGINE_H_
#define INFERENCE_ENGINE_H_

// The serving engine: takes generation requests from any thread and runs
// them with continuous batching (scheduler.h) on one engine thread, reporting
// each token through the request's callback.

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "data/tokenizer.h"
#include "inference/engine_metrics.h"
#include "inference/generation_request.h"
#include "inference/paged_kv_cache.h"
#include "inference/scheduler.h"
#include "inference/step_executor.h"

namespace mcc {
namespace inference {

struct EngineOptions {
  SchedulerOptions scheduler;
  int64_t max_positions = 0;  // The model's context.
  int64_t model_vocab = 0;    // Ids a prompt may hold.
  // Prompt tokens one request may hold (0: only the context bounds them).
  int64_t max_prompt_tokens = 0;
  // Requests that may wait beyond the scheduler's max_batch_size unfinished
  // ones; Submit refuses more (ResourceExhausted). 0: no bound.
  int64_t max_queued_requests = 0;
  // How often an idle engine calls StepExecutor::Idle.
  absl::Duration idle_interval = absl::Seconds(5);
};

class Engine {
 public:
  // `executor` and `cache` (this rank's; its block bookkeeping plans the
  // steps) outlive the engine. The tokenizer decodes generated text; it
  // may be null (token ids in and out): then there is no text, no stop
  // strings, no end-of-document stop, and every id of the model can be
  // sampled.
  Engine(EngineOptions options, StepExecutor* executor, PagedKvCache* cache,
         std::unique_ptr<data::Tokenizer> tokenizer);

  // Thread-safe. Checks the request (a clear InvalidArgument error says
  // what is wrong: empty prompt, an id outside the vocabulary, prompt plus
  // max_new_tokens beyond the context, more KV blocks than the pool holds,
  // bad sampling parameters) and queues it; returns its id. A full queue
  // (EngineOptions::max_queued_requests) is ResourceExhausted. The callback
  // then gets every event, the last with finished set (also after Cancel or
  // an engine failure).
  absl::StatusOr<uint64_t> Submit(GenerationRequest request,
                                  GenerationCallback callback);
  // Thread-safe. Drops a request at the next step, returning its KV blocks
  // (its callback gets a last event with FinishReason::kCancelled); unknown
  // ids are ignored.
  void Cancel(uint64_t id);
  // Thread-safe: requests submitted and not yet finished.
  int64_t unfinished() const { return unfinished_.load(); }

  // Engine thread. One step: queued requests join, one model step runs and
  // its tokens are reported. Returns false when there was nothing to run.
  absl::StatusOr<bool> Step();
  // Engine thread. Steps until Stop(); waits while idle. Then (or on an
  // executor error) finishes every request (cancelled), refuses later ones
  // (Unavailable), shuts the executor down and returns the first error.
  absl::Status Run();
  // Thread-safe: Run returns after its current step.
  void Stop();

  EngineMetrics& metrics() { return metrics_; }
  const EngineOptions& options() const { return options_; }

 private:
  void Drain();
  void ExpireDeadlines();
  void Finish(Sequence* s, FinishReason reason);
  int64_t SampleLimit() const;
  void Sampled(Sequence* s, const float* logits);
  void FailAll();
  absl::Status RunSteps();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  EngineOptions options_;
  StepExecutor* executor_;
  PagedKvCache* cache_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  Scheduler scheduler_;
  EngineMetrics metrics_;
  std::atomic<int64_t> unfinished_{0};

  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::vector<std::unique_ptr<Sequence>> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> cancels_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Run has returned.
};

// One request on an engine that no Run thread drives (eval's generation):
// submits it and steps until it finishes. Returns its last event (tokens,
// log-probabilities, finish reason); *first_step_done, when given, is when
// the first step ended (the prefill, when one chunk holds the prompt).
absl::StatusOr<GenerationEvent> GenerateOne(
    Engine* engine, GenerationRequest request,
    absl::Time* first_step_done = nullptr);

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_ENGINE_H_
