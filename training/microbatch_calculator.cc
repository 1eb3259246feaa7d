#include "training/microbatch_calculator.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace mcc {
namespace training {

absl::StatusOr<std::optional<BatchSizeRampup>> ParseRampupBatchSize(
    absl::string_view text) {
  const std::vector<absl::string_view> words =
      absl::StrSplit(text, absl::ByAnyChar(", \t"), absl::SkipEmpty());
  if (words.empty()) return std::nullopt;
  int64_t values[3];
  bool ok = words.size() == 3;
  for (size_t i = 0; ok && i < 3; ++i) {
    ok = absl::SimpleAtoi(words[i], &values[i]);
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rampup-batch-size '", text,
        "': expected three integers START INCR SAMPLES (\"32 32 1000\" or "
        "\"32,32,1000\")"));
  }
  return BatchSizeRampup{values[0], values[1], values[2]};
}

absl::StatusOr<MicroBatchCalculator> MicroBatchCalculator::Create(
    int64_t global_batch, int64_t micro_batch, int dp,
    std::optional<BatchSizeRampup> rampup) {
  if (micro_batch <= 0 || dp <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--micro-batch-size (", micro_batch,
                     ") x data-parallel size (", dp, ") must be positive"));
  }
  MicroBatchCalculator c;
  c.global_batch_ = global_batch;
  c.micro_batch_times_dp_ = micro_batch * dp;
  c.dp_ = dp;
  if (global_batch <= 0 || global_batch % c.micro_batch_times_dp_ != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--global-batch-size (", global_batch,
                     ") is not divisible by --micro-batch-size (", micro_batch,
                     ") x data-parallel size (", dp, ")"));
  }
  if (!rampup.has_value()) return c;
  const BatchSizeRampup& r = *rampup;
  const std::string given = absl::StrCat("--rampup-batch-size ", r.start, " ",
                                         r.increment, " ", r.samples, ": ");
  if (r.start <= 0 || r.increment <= 0 || r.samples <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(given, "START, INCR and SAMPLES must all be positive"));
  }
  if (r.start >= global_batch) {
    return absl::InvalidArgumentError(
        absl::StrCat(given, "START must be below --global-batch-size (",
                     global_batch, "), which the ramp grows to"));
  }
  const int64_t diff = global_batch - r.start;
  if (diff % r.increment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        given, "--global-batch-size (", global_batch, ") - START (", r.start,
        ") = ", diff, " is not a multiple of INCR (", r.increment, ")"));
  }
  c.rampup_ = r;
  // Fractional, as Megatron's ramup_samples / num_increments.
  c.samples_per_increment_ =
      static_cast<double>(r.samples) / static_cast<double>(diff / r.increment);
  return c;
}

int64_t MicroBatchCalculator::GlobalBatchSize(int64_t consumed_samples) const {
  if (!rampup_.has_value() || consumed_samples > rampup_->samples) {
    return global_batch_;
  }
  // Truncated toward zero, as Python's int() of a non-negative quotient.
  const int64_t steps = static_cast<int64_t>(
      static_cast<double>(consumed_samples) / samples_per_increment_);
  return std::min(global_batch_, rampup_->start + steps * rampup_->increment);
}

int MicroBatchCalculator::NumMicroBatches(int64_t consumed_samples) const {
  return static_cast<int>(GlobalBatchSize(consumed_samples) /
                          micro_batch_times_dp_);
}

absl::Status MicroBatchCalculator::CheckDivisibleFrom(
    int64_t consumed_samples) const {
  if (!rampup_.has_value()) return absl::OkStatus();
  for (int64_t size = GlobalBatchSize(consumed_samples); size < global_batch_;
       size += rampup_->increment) {
    if (size % micro_batch_times_dp_ != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rampup-batch-size ", rampup_->start, " ", rampup_->increment, " ",
          rampup_->samples, ": the ramp's global batch size ", size,
          consumed_samples > 0
              ? absl::StrCat(" (still ahead after ", consumed_samples,
                             " consumed samples)")
              : "",
          " is not divisible by --micro-batch-size (",
          micro_batch_times_dp_ / dp_, ") x data-parallel size (", dp_, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace training
}  // namespace mcc
