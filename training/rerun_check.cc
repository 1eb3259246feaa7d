#include "training/rerun_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mcc {
namespace training {
namespace {

double LargestOf(const std::deque<double>& values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

// Why `value` (named `what`) is suspicious against `recent`, or "".
std::string Judge(const char* what, double value, bool check_spike,
                  const std::deque<double>& recent, double factor) {
  if (!std::isfinite(value)) return absl::StrCat("the ", what, " is ", value);
  if (!check_spike || recent.empty()) return "";
  const double largest = LargestOf(recent);
  if (value <= factor * largest) return "";
  return absl::StrFormat(
      "the %s %.6g is above %.6g x the largest of the last %d steps (%.6g)",
      what, value, factor, static_cast<int>(recent.size()), largest);
}

}  // namespace

absl::StatusOr<RerunCheckOptions::Injection> ParseInjection(
    const std::string& name) {
  if (name == "transient_error") {
    return RerunCheckOptions::Injection::kTransient;
  }
  if (name == "persistent_error") {
    return RerunCheckOptions::Injection::kPersistent;
  }
  if (name == "correct_result") return RerunCheckOptions::Injection::kCorrect;
  return absl::InvalidArgumentError(
      absl::StrCat("--error-injection-type must be transient_error, "
                   "persistent_error or correct_result, got '",
                   name, "'"));
}

RerunCheck::RerunCheck(RerunCheckOptions options)
    : options_(std::move(options)) {}

double RerunCheck::SeenLoss(int64_t iteration, double loss, bool rerun) const {
  const bool injected =
      options_.injection_rate > 0 && iteration % options_.injection_rate == 0;
  if (!injected) return loss;
  using Injection = RerunCheckOptions::Injection;
  const bool wrong = options_.injection == Injection::kPersistent ||
                     (options_.injection == Injection::kTransient && !rerun);
  return wrong ? std::numeric_limits<double>::quiet_NaN() : loss;
}

std::string RerunCheck::Suspicion(double loss, double grad_norm) const {
  std::string why = Judge("loss", loss, options_.check_spiky_loss, losses_,
                          options_.spike_factor);
  if (!why.empty()) return why;
  return Judge("gradient norm", grad_norm, options_.check_large_grads,
               grad_norms_, options_.spike_factor);
}

void RerunCheck::Accept(double loss, double grad_norm) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return;
  losses_.push_back(loss);
  grad_norms_.push_back(grad_norm);
  while (static_cast<int>(losses_.size()) > std::max(1, options_.window)) {
    losses_.pop_front();
    grad_norms_.pop_front();
  }
}

}  // namespace training
}  // namespace mcc
