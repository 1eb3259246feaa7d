#ifndef OPTIM_LOSS_SCALER_H_
#define OPTIM_LOSS_SCALER_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace mcc {
namespace optim {

// Megatron's flags for fp16 loss scaling.
struct LossScalerConfig {
  double initial_scale = 4294967296.0;  // --initial-loss-scale (2^32)
  double min_scale = 1.0;               // --min-loss-scale
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;  // --loss-scale-window
  int64_t hysteresis = 2;          // --hysteresis
  // --loss-scale: a fixed scale when > 0 (no dynamic updates).
  double static_scale = 0.0;
};

// Dynamic loss scaling for fp16 training. Each step reports whether any
// gradient was inf or NaN: such steps are skipped by the optimizer, and after
// `hysteresis` of them in a row the scale backs off; after growth_interval
// clean steps in a row it grows.
class LossScaler {
 public:
  struct State {
    double scale = 1.0;
    int64_t growth_tracker = 0;
    int64_t hysteresis_tracker = 0;
  };

  static absl::StatusOr<LossScaler> Create(LossScalerConfig config);

  double scale() const { return state_.scale; }
  double inverse_scale() const { return 1.0 / state_.scale; }
  bool is_dynamic() const { return config_.static_scale <= 0; }

  // Called once per step after the gradients are checked.
  void Update(bool found_inf);

  const State& state() const { return state_; }
  void set_state(const State& state) { state_ = state; }

 private:
  LossScalerConfig config_;
  State state_;
};

}  // namespace optim
}  // namespace mcc

#endif  // OPTIM_LOSS_SCALER_H_
