#include "optim/state_precision.h"

#include "absl/strings/str_cat.h"

namespace mcc {
namespace optim {

DType StatePrecision::Of(absl::string_view state) const {
  if (state == "exp_avg") return exp_avg;
  if (state == "exp_avg_sq") return exp_avg_sq;
  if (state == "main_param") return main_params;
  return DType::kFloat32;
}

absl::StatusOr<DType> ParseStateDType(absl::string_view flag,
                                      absl::string_view value) {
  const bool main_params = flag == "--main-params-dtype";
  const char* accepted = main_params ? "fp32 or fp16" : "fp32, bf16 or fp16";
  if (value == "fp8") {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " fp8: fp8 optimizer state is not supported here (",
                     accepted, ")"));
  }
  if (value == "fp32") return DType::kFloat32;
  if (value == "fp16") return DType::kFloat16;
  if (value == "bf16" && !main_params) return DType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " '", value, "' is not ", accepted));
}

std::string DescribeStatePrecision(const StatePrecision& p) {
  return absl::StrCat("exp_avg ", DTypeName(p.exp_avg), ", exp_avg_sq ",
                      DTypeName(p.exp_avg_sq), ", main params ",
                      DTypeName(p.main_params),
                      " (updated in fp32, stored rounded to nearest)");
}

}  // namespace optim
}  // namespace mcc
