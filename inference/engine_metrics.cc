#include "inference/engine_metrics.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mcc {
namespace inference {
namespace {
constexpr size_t kKeep = 100000;  // Latency samples kept for percentiles.
}  // namespace

void EngineMetrics::Keep(std::vector<double>* samples, size_t* next, double v) {
  if (samples->size() < kKeep) {
    samples->push_back(v);
  } else {
    (*samples)[*next] = v;
    *next = (*next + 1) % kKeep;
  }
}

double EngineMetrics::Percentile(const std::vector<double>& samples, double p) {
  if (samples.empty()) return 0;
  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  const double rank = p / 100.0 * (sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(sorted.size() - 1, lo + 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo);
}

void EngineMetrics::RecordRequest(int64_t prompt_tokens) {
  absl::MutexLock lock(&mu_);
  ++requests_;
  prompt_tokens_ += prompt_tokens;
}
void EngineMetrics::RecordRejected() {
  absl::MutexLock lock(&mu_);
  ++rejected_;
}
void EngineMetrics::RecordFinished() {
  absl::MutexLock lock(&mu_);
  ++finished_;
}
void EngineMetrics::RecordStep(int64_t sequences, int64_t tokens,
                               double model_seconds) {
  absl::MutexLock lock(&mu_);
  ++steps_;
  ++batch_sizes_[sequences];
  Keep(&step_model_, &step_model_next_, model_seconds);
}
void EngineMetrics::RecordStepAfterModel(double seconds) {
  absl::MutexLock lock(&mu_);
  Keep(&step_after_, &step_after_next_, seconds);
}
void EngineMetrics::RecordOutputToken() {
  absl::MutexLock lock(&mu_);
  ++output_tokens_;
}
void EngineMetrics::RecordTimeToFirstToken(double seconds) {
  absl::MutexLock lock(&mu_);
  Keep(&ttft_, &ttft_next_, seconds);
}
void EngineMetrics::RecordInterTokenLatency(double seconds) {
  absl::MutexLock lock(&mu_);
  Keep(&itl_, &itl_next_, seconds);
}
void EngineMetrics::SetQueue(int64_t waiting, int64_t running,
                             int64_t free_blocks) {
  absl::MutexLock lock(&mu_);
  waiting_ = waiting;
  running_ = running;
  free_blocks_ = free_blocks;
}

double EngineMetrics::TimeToFirstTokenPercentile(double p) const {
  absl::MutexLock lock(&mu_);
  return Percentile(ttft_, p);
}
double EngineMetrics::InterTokenLatencyPercentile(double p) const {
  absl::MutexLock lock(&mu_);
  return Percentile(itl_, p);
}

std::string EngineMetrics::Render() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  auto counter = [&](const char* name, const char* help, int64_t v) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name,
                    " counter\n", name, " ", v, "\n");
  };
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name,
                    " gauge\n", name, " ", v, "\n");
  };
  counter("serve_requests_total", "Generation requests accepted.", requests_);
  counter("serve_requests_rejected_total", "Requests refused (4xx).",
          rejected_);
  counter("serve_requests_finished_total", "Generations finished.", finished_);
  counter("serve_prompt_tokens_total", "Prompt tokens in.", prompt_tokens_);
  counter("serve_output_tokens_total", "Tokens generated.", output_tokens_);
  counter("serve_steps_total", "Model steps run.", steps_);
  gauge("serve_queue_depth", "Requests waiting for a batch slot or blocks.",
        waiting_);
  gauge("serve_running_sequences", "Sequences in the running batch.", running_);
  gauge("serve_kv_cache_free_blocks", "Free blocks of the KV-cache pool.",
        free_blocks_);
  // Batch sizes as a cumulative histogram over powers of two.
  absl::StrAppend(&out,
                  "# HELP serve_batch_size Sequences per model step.\n"
                  "# TYPE serve_batch_size histogram\n");
  int64_t count = 0, sum = 0;
  for (const auto& [size, steps] : batch_sizes_) sum += size * steps;
  for (int64_t bound = 1; bound <= 1024; bound *= 2) {
    count = 0;
    for (const auto& [size, steps] : batch_sizes_) {
      if (size <= bound) count += steps;
    }
    absl::StrAppend(&out, "serve_batch_size_bucket{le=\"", bound, "\"} ", count,
                    "\n");
  }
  absl::StrAppend(&out, "serve_batch_size_bucket{le=\"+Inf\"} ", steps_,
                  "\nserve_batch_size_sum ", sum, "\nserve_batch_size_count ",
                  steps_, "\n");
  auto summary = [&](const char* name, const char* help,
                     const std::vector<double>& samples) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name,
                    " summary\n");
    for (double q : {0.5, 0.9, 0.99}) {
      absl::StrAppend(&out, name, "{quantile=\"", q, "\"} ",
                      absl::StrFormat("%.6f", Percentile(samples, q * 100)),
                      "\n");
    }
    double total = 0;
    for (double v : samples) total += v;
    absl::StrAppend(&out, name, "_sum ", absl::StrFormat("%.6f", total), "\n",
                    name, "_count ", samples.size(), "\n");
  };
  summary("serve_time_to_first_token_seconds",
          "From request to its first generated token.", ttft_);
  summary("serve_inter_token_latency_seconds",
          "Between consecutive tokens of one request.", itl_);
  summary("serve_step_model_seconds",
          "A step's model forward (every rank; the rest is below).",
          step_model_);
  summary("serve_step_after_model_seconds",
          "A step's sampling, detokenising and callbacks after the model.",
          step_after_);
  return out;
}

}  // namespace inference
}  // namespace mcc
