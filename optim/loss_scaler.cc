#include "optim/loss_scaler.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace mcc {
namespace optim {

absl::StatusOr<LossScaler> LossScaler::Create(LossScalerConfig config) {
  if (config.static_scale <= 0) {
    if (config.initial_scale <= 0 || config.min_scale <= 0 ||
        config.min_scale > config.initial_scale) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loss scale: need 0 < --min-loss-scale (", config.min_scale,
          ") <= --initial-loss-scale (", config.initial_scale, ")"));
    }
    if (config.growth_interval <= 0 || config.hysteresis <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "loss scale: --loss-scale-window (", config.growth_interval,
          ") and --hysteresis (", config.hysteresis, ") must be positive"));
    }
    if (config.growth_factor <= 1 || config.backoff_factor <= 0 ||
        config.backoff_factor >= 1) {
      return absl::InvalidArgumentError(
          "loss scale: growth factor must exceed 1 and backoff lie in (0, 1)");
    }
  }
  LossScaler s;
  s.config_ = config;
  s.state_.scale =
      config.static_scale > 0 ? config.static_scale : config.initial_scale;
  s.state_.hysteresis_tracker = config.hysteresis;
  return s;
}

void LossScaler::Update(bool found_inf) {
  if (!is_dynamic()) return;
  if (found_inf) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker -= 1;
    if (state_.hysteresis_tracker <= 0) {
      state_.scale =
          std::max(state_.scale * config_.backoff_factor, config_.min_scale);
    }
    return;
  }
  state_.growth_tracker += 1;
  if (state_.growth_tracker == config_.growth_interval) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = config_.hysteresis;
    state_.scale *= config_.growth_factor;
  }
}

}  // namespace optim
}  // namespace mcc
