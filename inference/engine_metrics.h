#ifndef INFERENCE_ENGINE_METRICS_H_
#define INFERENCE_ENGINE_METRICS_H_

// Counters and latency distributions of a serving engine, in Prometheus's
// text format for GET /metrics.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace mcc {
namespace inference {

// Thread-safe: the engine thread records, HTTP threads read.
class EngineMetrics {
 public:
  void RecordRequest(int64_t prompt_tokens);
  void RecordRejected();
  void RecordFinished();
  // A model step over `sequences` sequences and `tokens` rows; the model's
  // time (every rank's forward, as rank 0 waits for it).
  void RecordStep(int64_t sequences, int64_t tokens, double model_seconds);
  // The rest of that step: sampling, detokenising, the requests' callbacks.
  void RecordStepAfterModel(double seconds);
  void RecordOutputToken();
  void RecordTimeToFirstToken(double seconds);
  void RecordInterTokenLatency(double seconds);
  void SetQueue(int64_t waiting, int64_t running, int64_t free_blocks);

  // The p-th percentile (0..100) of the last samples kept, 0 without any.
  double TimeToFirstTokenPercentile(double p) const;
  double InterTokenLatencyPercentile(double p) const;

  int64_t waiting() const {
    absl::MutexLock lock(&mu_);
    return waiting_;
  }
  int64_t running() const {
    absl::MutexLock lock(&mu_);
    return running_;
  }

  // Prometheus exposition text.
  std::string Render() const;

 private:
  static double Percentile(const std::vector<double>& samples, double p);
  static void Keep(std::vector<double>* samples, size_t* next, double v);

  mutable absl::Mutex mu_;
  int64_t requests_ = 0, rejected_ = 0, finished_ = 0;
  int64_t prompt_tokens_ = 0, output_tokens_ = 0, steps_ = 0;
  int64_t waiting_ = 0, running_ = 0, free_blocks_ = 0;
  std::map<int64_t, int64_t> batch_sizes_;  // Sequences in a step -> steps.
  std::vector<double> ttft_, itl_, step_model_, step_after_;
  size_t ttft_next_ = 0, itl_next_ = 0, step_model_next_ = 0,
         step_after_next_ = 0;
};

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_ENGINE_METRICS_H_
