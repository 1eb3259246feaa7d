#ifndef INFERENCE_FAKE_STEP_EXECUTOR_H_
#define INFERENCE_FAKE_STEP_EXECUTOR_H_

// For tests of what surrounds the model (the engine's bookkeeping, the HTTP
// server): a StepExecutor without a model. Each logit row favours the token
// after the row's token, so greedy generation is predictable; like
// ModelRunner it refuses a step whose rows' positions their block tables do
// not cover (the refusal that once stopped serve). Thread-safe counters.

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "inference/step_executor.h"

namespace mcc {
namespace inference {

class FakeStepExecutor : public StepExecutor {
 public:
  // `favoured` ids < vocab are the ones the logits pick from.
  FakeStepExecutor(int64_t vocab, int64_t block_size, int64_t favoured)
      : vocab_(vocab), block_size_(block_size), favoured_(favoured) {}

  // Each step sleeps this long first (a slow model).
  void set_step_time(absl::Duration d) { step_time_ = d; }
  int64_t steps() const { return steps_.load(); }

  absl::StatusOr<std::vector<float>> Execute(const StepRows& rows) override {
    ++steps_;
    if (step_time_ > absl::ZeroDuration()) absl::SleepFor(step_time_);
    for (int64_t r = 0; r < rows.rows(); ++r) {
      const BlockTable& table = rows.tables[rows.table[r]];
      if (rows.positions[r] < 0 || rows.positions[r] / block_size_ >=
                                       static_cast<int64_t>(table.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("row ", r, ": position ", rows.positions[r],
                         " is beyond its ", table.size(), " KV blocks"));
      }
    }
    std::vector<float> logits(rows.logit_rows.size() * vocab_, 0.0f);
    for (size_t i = 0; i < rows.logit_rows.size(); ++i) {
      const int64_t next = (rows.tokens[rows.logit_rows[i]] + 1) % favoured_;
      logits[i * vocab_ + next] = 10.0f;
    }
    return logits;
  }

 private:
  const int64_t vocab_, block_size_, favoured_;
  absl::Duration step_time_ = absl::ZeroDuration();
  std::atomic<int64_t> steps_{0};
};

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_FAKE_STEP_EXECUTOR_H_
