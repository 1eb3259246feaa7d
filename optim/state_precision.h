#ifndef OPTIM_STATE_PRECISION_H_
#define OPTIM_STATE_PRECISION_H_

// Lower-precision optimizer state, as Megatron's precision-aware optimizer
// (--use-precision-aware-optimizer with --main-params-dtype, --exp-avg-dtype
// and --exp-avg-sq-dtype): the state is stored in the chosen dtype, and each
// update widens it to fp32, computes AdamW in fp32 and stores the result
// back with round-to-nearest-even (no stochastic rounding). The dtypes
// Megatron accepts, less fp8 (no fp8 storage here):
//   --main-params-dtype  fp32 | fp16
//   --exp-avg-dtype      fp32 | bf16 | fp16
//   --exp-avg-sq-dtype   fp32 | bf16 | fp16
// fp16 keeps 11 significant bits but underflows below 6e-5 (subnormals to
// 6e-8): small second moments lose their precision there first.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"

namespace mcc {
namespace optim {

struct StatePrecision {
  DType main_params = DType::kFloat32;
  DType exp_avg = DType::kFloat32;
  DType exp_avg_sq = DType::kFloat32;

  // Whether any state is stored below fp32.
  bool lowered() const {
    return main_params != DType::kFloat32 || exp_avg != DType::kFloat32 ||
           exp_avg_sq != DType::kFloat32;
  }
  // The storage dtype of a state of the update rule ("exp_avg",
  // "exp_avg_sq", "main_param"; fp32 for any other).
  DType Of(absl::string_view state) const;
};

// The dtype a flag names, refused (naming the flag and what it accepts)
// unless it is one Megatron allows for that flag: `flag` is
// "--main-params-dtype", "--exp-avg-dtype" or "--exp-avg-sq-dtype".
absl::StatusOr<DType> ParseStateDType(absl::string_view flag,
                                      absl::string_view value);

// A description for the run log: "exp_avg bf16, exp_avg_sq bf16, main
// params fp32 (round to nearest)".
std::string DescribeStatePrecision(const StatePrecision& precision);

}  // namespace optim
}  // namespace mcc

#endif  // OPTIM_STATE_PRECISION_H_
