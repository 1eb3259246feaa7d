#ifndef TRAINING_MICROBATCH_CALCULATOR_H_
#define TRAINING_MICROBATCH_CALCULATOR_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

// The global batch size of each step and the micro-batches that make it, as
// Megatron's num_microbatches_calculator: constant, or ramped up from a
// start size by fixed increments as samples are consumed
// (--rampup-batch-size START INCR SAMPLES).

namespace mcc {
namespace training {

// --rampup-batch-size: the global batch starts at `start` and grows by
// `increment` every samples / ((global - start) / increment) consumed
// samples until it reaches --global-batch-size.
struct BatchSizeRampup {
  int64_t start = 0;
  int64_t increment = 0;
  int64_t samples = 0;
};

// "START,INCR,SAMPLES" or "START INCR SAMPLES" (Megatron's three words, as
// tools/train joins them); empty: no ramp. Errors name the flag.
absl::StatusOr<std::optional<BatchSizeRampup>> ParseRampupBatchSize(
    absl::string_view text);

class MicroBatchCalculator {
 public:
  // `global_batch` (the final size), over `micro_batch` x `dp` samples per
  // micro-batch step. Refuses, naming the flag, what Megatron asserts: a
  // non-positive start or increment, no positive ramp length, a start
  // above the global batch, a difference that is not a multiple of the
  // increment; and, as here nothing is left to ramp, a start equal to it.
  // The final size must divide by micro_batch x dp.
  static absl::StatusOr<MicroBatchCalculator> Create(
      int64_t global_batch, int64_t micro_batch, int dp,
      std::optional<BatchSizeRampup> rampup);

  // The global batch size of the step that starts after `consumed_samples`
  // (Megatron's update(consumed_samples) then its current global batch).
  int64_t GlobalBatchSize(int64_t consumed_samples) const;
  // Micro-batches per DP rank of that step: GlobalBatchSize / (mbs x dp).
  int NumMicroBatches(int64_t consumed_samples) const;
  // Every size still to come from `consumed_samples` on divides by
  // micro_batch x dp (Megatron checks each as it comes; here a resumed or
  // resharded run learns it at the start). The error names the flags.
  absl::Status CheckDivisibleFrom(int64_t consumed_samples) const;

  int64_t global_batch() const { return global_batch_; }
  int64_t micro_batch_times_dp() const { return micro_batch_times_dp_; }
  bool ramping() const { return rampup_.has_value(); }
  const std::optional<BatchSizeRampup>& rampup() const { return rampup_; }
  // Samples per increment (fractional, as Megatron's).
  double samples_per_increment() const { return samples_per_increment_; }

 private:
  int64_t global_batch_ = 0;
  int64_t micro_batch_times_dp_ = 1;
  int dp_ = 1;
  std::optional<BatchSizeRampup> rampup_;
  double samples_per_increment_ = 0;
};

}  // namespace training
}  // namespace mcc

#endif  // TRAINING_MICROBATCH_CALCULATOR_H_
