#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mcc {
namespace optim {

absl::StatusOr<LrDecayStyle> ParseLrDecayStyle(absl::string_view name) {
  if (name == "constant") return LrDecayStyle::kConstant;
  if (name == "linear") return LrDecayStyle::kLinear;
  if (name == "cosine") return LrDecayStyle::kCosine;
  if (name == "inverse-square-root") return LrDecayStyle::kInverseSquareRoot;
  if (name == "WSD") return LrDecayStyle::kWsd;
  return absl::InvalidArgumentError(absl::StrCat(
      "--lr-decay-style: unknown style '", name,
      "' (expected constant, linear, cosine, inverse-square-root or WSD)"));
}

absl::StatusOr<WsdDecayStyle> ParseWsdDecayStyle(absl::string_view name) {
  if (name == "exponential") return WsdDecayStyle::kExponential;
  if (name == "linear") return WsdDecayStyle::kLinear;
  if (name == "cosine") return WsdDecayStyle::kCosine;
  if (name == "minus_sqrt") return WsdDecayStyle::kMinusSqrt;
  return absl::InvalidArgumentError(
      absl::StrCat("--lr-wsd-decay-style: unknown style '", name,
                   "' (expected exponential, linear, cosine or minus_sqrt)"));
}

namespace {

// WSD's annealing coefficient, 1 at the start of the annealing and 0 at its
// end, for the fraction `ratio` of it done.
double WsdCoefficient(WsdDecayStyle style, double ratio) {
  switch (style) {
    case WsdDecayStyle::kExponential:
      return 2.0 * std::pow(0.5, ratio) - 1.0;
    case WsdDecayStyle::kLinear:
      return 1.0 - ratio;
    case WsdDecayStyle::kCosine:
      return 0.5 * (std::cos(M_PI * ratio) + 1.0);
    case WsdDecayStyle::kMinusSqrt:
      return 1.0 - std::sqrt(ratio);
  }
  return 1.0;
}

}  // namespace

absl::StatusOr<LrSchedule> LrSchedule::Create(LrScheduleConfig config) {
  if (config.lr < 0 || config.min_lr < 0 || config.init_lr < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("learning rates must be non-negative: --lr ", config.lr,
                     ", --min-lr ", config.min_lr));
  }
  if (config.min_lr > config.lr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min-lr (", config.min_lr, ") exceeds --lr (", config.lr, ")"));
  }
  if (config.decay_iters < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lr-decay-iters must be non-negative, got ", config.decay_iters));
  }
  if (config.decay_style == LrDecayStyle::kWsd && config.wsd_decay_iters <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lr-decay-style WSD needs --lr-wsd-decay-iters > 0, got ",
        config.wsd_decay_iters));
  }
  LrSchedule s;
  s.config_ = config;
  if (config.warmup_fraction >= 0) {
    if (config.warmup_fraction > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lr-warmup-fraction must be in [0, 1], got ",
                       config.warmup_fraction));
    }
    s.warmup_iters_ =
        static_cast<int64_t>(config.warmup_fraction * config.decay_iters);
  } else {
    s.warmup_iters_ = config.warmup_iters;
  }
  if (s.warmup_iters_ < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lr-warmup-iters must be non-negative, got ", s.warmup_iters_));
  }
  if (config.decay_style != LrDecayStyle::kConstant &&
      config.decay_style != LrDecayStyle::kInverseSquareRoot &&
      s.warmup_iters_ > config.decay_iters) {
    return absl::InvalidArgumentError(
        absl::StrCat("--lr-warmup-iters (", s.warmup_iters_,
                     ") exceeds --lr-decay-iters (", config.decay_iters, ")"));
  }
  return s;
}

double LrSchedule::LearningRate(int64_t iteration) const {
  return LearningRateAt(static_cast<double>(iteration));
}

// In doubles, so a fractional position (samples over the global batch) is
// exact where Megatron's sample-counted scheduler is; whole iterations give
// what integer arithmetic gave (every value below 2^53 is exact).
double LrSchedule::LearningRateAt(double iteration) const {
  const LrScheduleConfig& c = config_;
  const double warmup_iters = static_cast<double>(warmup_iters_);
  const double decay_iters = static_cast<double>(c.decay_iters);
  if (warmup_iters_ > 0 && iteration <= warmup_iters) {
    return c.init_lr + (c.lr - c.init_lr) * iteration / warmup_iters;
  }
  switch (c.decay_style) {
    case LrDecayStyle::kConstant:
      return c.lr;
    case LrDecayStyle::kInverseSquareRoot: {
      const double warmup = std::max<int64_t>(warmup_iters_, 1);
      const double lr =
          c.lr * std::sqrt(warmup) / std::sqrt(std::max(iteration, 1.0));
      return std::max(c.min_lr, lr);
    }
    case LrDecayStyle::kLinear:
    case LrDecayStyle::kCosine:
    case LrDecayStyle::kWsd:
      break;
  }
  if (iteration > decay_iters) return c.min_lr;
  if (c.decay_style == LrDecayStyle::kWsd) {
    // The annealing may begin before the warmup ends when wsd_decay_iters
    // exceeds the decay span; Megatron then starts it part-way, as here.
    const double anneal_start =
        static_cast<double>(c.decay_iters - c.wsd_decay_iters);
    if (iteration <= anneal_start) return c.lr;
    const double ratio =
        (iteration - anneal_start) / static_cast<double>(c.wsd_decay_iters);
    return c.min_lr +
           WsdCoefficient(c.wsd_decay_style, ratio) * (c.lr - c.min_lr);
  }
  const double span = static_cast<double>(c.decay_iters - warmup_iters_);
  const double ratio = span <= 0 ? 1.0 : (iteration - warmup_iters) / span;
  const double coeff = c.decay_style == LrDecayStyle::kLinear
                           ? 1.0 - ratio
                           : 0.5 * (std::cos(M_PI * ratio) + 1.0);
  return c.min_lr + coeff * (c.lr - c.min_lr);
}

}  // namespace optim
}  // namespace mcc
