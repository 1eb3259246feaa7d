#include "core/fp8_scaling.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace mcc {

absl::StatusOr<Fp8Recipe> MakeFp8Recipe(absl::string_view format,
                                        absl::string_view recipe, int margin,
                                        int amax_history_len,
                                        absl::string_view amax_compute_algo) {
  Fp8Recipe r;
  if (format == "e4m3") {
    r.backward_format = Fp8Format::kE4M3;
  } else if (format == "hybrid") {
    r.backward_format = Fp8Format::kE5M2;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--fp8-format: '", format, "' is not e4m3 or hybrid"));
  }
  if (recipe == "tensorwise") {
    r.recipe = Fp8ScalingRecipe::kTensorwise;
  } else if (recipe == "delayed") {
    r.recipe = Fp8ScalingRecipe::kDelayed;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fp8-recipe: '", recipe,
        "' is not tensorwise or delayed (Megatron's mxfp8 and blockwise "
        "need Blackwell scaling hardware and are not offered)"));
  }
  if (amax_compute_algo == "max") {
    r.amax_compute_algo = Fp8AmaxComputeAlgo::kMax;
  } else if (amax_compute_algo == "most_recent") {
    r.amax_compute_algo = Fp8AmaxComputeAlgo::kMostRecent;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--fp8-amax-compute-algo: '", amax_compute_algo,
                     "' is not max or most_recent"));
  }
  if (amax_history_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fp8-amax-history-len: ", amax_history_len, " is not at least 1"));
  }
  if (margin < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--fp8-margin: ", margin, " is negative"));
  }
  r.margin = margin;
  r.amax_history_len = amax_history_len;
  return r;
}

std::string DescribeFp8Recipe(const Fp8Recipe& r) {
  const bool hybrid = r.backward_format == Fp8Format::kE5M2;
  if (r.recipe == Fp8ScalingRecipe::kTensorwise) {
    return absl::StrCat(hybrid ? "hybrid" : "e4m3", " tensorwise");
  }
  return absl::StrCat(
      hybrid ? "hybrid" : "e4m3", " delayed (margin ", r.margin,
      ", amax history ", r.amax_history_len, ", ",
      r.amax_compute_algo == Fp8AmaxComputeAlgo::kMax ? "max" : "most_recent",
      ")");
}

float Fp8ScaleFromAmax(float amax, float fp8_max, int margin,
                       float previous_scale) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous_scale;
  return (fp8_max / amax) / std::ldexp(1.0f, margin);
}

Fp8TensorScaler::Fp8TensorScaler(const Fp8Recipe& recipe, Fp8Format format)
    : recipe_(recipe), format_(format) {}

float Fp8TensorScaler::Next(float amax) {
  const float fp8_max = Fp8Max(format_);
  if (recipe_.recipe == Fp8ScalingRecipe::kTensorwise) {
    scale_ = Fp8ScaleFromAmax(amax, fp8_max, 0, scale_);
    return scale_;
  }
  if (history_.empty()) {
    scale_ = Fp8ScaleFromAmax(amax, fp8_max, recipe_.margin, scale_);
  } else {
    float reduced = history_.front();
    if (recipe_.amax_compute_algo == Fp8AmaxComputeAlgo::kMax) {
      // A NaN anywhere in the window wins (and so keeps the scale).
      for (const float a : history_) {
        if (std::isnan(a) || std::isnan(reduced)) {
          reduced = a + reduced;
        } else {
          reduced = std::max(reduced, a);
        }
      }
    }
    scale_ = Fp8ScaleFromAmax(reduced, fp8_max, recipe_.margin, scale_);
  }
  history_.push_front(amax);
  while (static_cast<int>(history_.size()) > recipe_.amax_history_len) {
    history_.pop_back();
  }
  return scale_;
}

}  // namespace mcc
