#ifndef OPTIM_LR_SCHEDULE_H_
#define OPTIM_LR_SCHEDULE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace optim {

enum class LrDecayStyle { kConstant, kLinear, kCosine, kInverseSquareRoot };

absl::StatusOr<LrDecayStyle> ParseLrDecayStyle(absl::string_view name);

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
};

// The learning rate at each iteration, as Megatron's
// OptimizerParamScheduler: linear warmup from init_lr to lr, then decay to
// min_lr over [warmup, decay_iters], min_lr afterwards.
class LrSchedule {
 public:
  // Fails naming the flag when the configuration is inconsistent.
  static absl::StatusOr<LrSchedule> Create(LrScheduleConfig config);

  double LearningRate(int64_t iteration) const;
  int64_t warmup_iters() const { return warmup_iters_; }
  const LrScheduleConfig& config() const { return config_; }

 private:
  LrScheduleConfig config_;
  int64_t warmup_iters_ = 0;
};

}  // namespace optim
}  // namespace mcc

#endif  // OPTIM_LR_SCHEDULE_H_
