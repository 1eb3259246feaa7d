#ifndef OPTIM_LR_SCHEDULE_H_
#define OPTIM_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace optim {

enum class LrDecayStyle {
  kConstant,
  kLinear,
  kCosine,
  kInverseSquareRoot,
  kWsd,  // Warmup-stable-decay: lr held at its peak, then annealed.
};

// The annealing curve of WSD's last lr_wsd_decay_iters iterations.
enum class WsdDecayStyle { kExponential, kLinear, kCosine, kMinusSqrt };

absl::StatusOr<LrDecayStyle> ParseLrDecayStyle(absl::string_view name);
absl::StatusOr<WsdDecayStyle> ParseWsdDecayStyle(absl::string_view name);

// Megatron's flags for the learning-rate schedule, counted in iterations.
struct LrScheduleConfig {
  double lr = 1e-4;      // --lr: the peak learning rate.
  double min_lr = 0.0;   // --min-lr
  double init_lr = 0.0;  // Warmup starts here (Megatron's --lr-warmup-init).
  int64_t warmup_iters = 0;  // --lr-warmup-iters
  // --lr-warmup-fraction; when >= 0 it overrides warmup_iters as a fraction
  // of decay_iters.
  double warmup_fraction = -1.0;
  int64_t decay_iters = 0;  // --lr-decay-iters (Megatron: --train-iters if 0)
  LrDecayStyle decay_style = LrDecayStyle::kLinear;  // --lr-decay-style
  // WSD only: the last wsd_decay_iters of [0, decay_iters] anneal from lr to
  // min_lr along wsd_decay_style (--lr-wsd-decay-iters,
  // --lr-wsd-decay-style); before them the rate stays at lr.
  int64_t wsd_decay_iters = 0;
  WsdDecayStyle wsd_decay_style = WsdDecayStyle::kExponential;
};

// The learning rate at each iteration, as Megatron's
// OptimizerParamScheduler: linear warmup from init_lr to lr, then decay to
// min_lr over [warmup, decay_iters], min_lr afterwards. WSD keeps lr until
// decay_iters - wsd_decay_iters and anneals over the rest.
class LrSchedule {
 public:
  // Fails naming the flag when the configuration is inconsistent.
  static absl::StatusOr<LrSchedule> Create(LrScheduleConfig config);

  double LearningRate(int64_t iteration) const;
  // At a fractional position in iterations: under a batch-size ramp, the
  // samples consumed over the final global batch size, as Megatron's
  // scheduler counts samples (warmup and decay lengths are iterations of
  // the final global batch).
  double LearningRateAt(double iteration) const;
  int64_t warmup_iters() const { return warmup_iters_; }
  const LrScheduleConfig& config() const { return config_; }

 private:
  LrScheduleConfig config_;
  int64_t warmup_iters_ = 0;
};

}  // namespace optim
}  // namespace mcc

#endif  // OPTIM_LR_SCHEDULE_H_
