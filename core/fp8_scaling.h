#ifndef CORE_FP8_SCALING_H_
#define CORE_FP8_SCALING_H_

// FP8 training's per-tensor scaling, in Megatron-LM's and
// TransformerEngine's terms.
//
// A tensor x is cast to FP8 as fp8(x * scale) and used as fp8 / scale
// (core/ops/fp8_gemm.h). The scale comes from an amax (max |x|):
//
//   scale = (fp8_max / amax) / 2^margin,
//
// kept at its previous value when amax is 0 or not finite (so a zero or
// overflowed tensor does not poison it); the first scale is 1.
//
// Recipes (Megatron's --fp8-recipe):
//   tensorwise  current scaling (TransformerEngine's Float8CurrentScaling):
//               each cast uses the amax of the tensor being cast. No margin
//               (TransformerEngine's current scaling has none).
//   delayed     TransformerEngine's DelayedScaling: each cast uses the scale
//               computed from the amaxes of earlier casts of the same tensor
//               (the last --fp8-amax-history-len of them), reduced by
//               --fp8-amax-compute-algo: max (the largest) or most_recent;
//               then the tensor's own amax joins the history. On a device
//               the cast needs no amax of its own first, which is the
//               recipe's point. One difference from TransformerEngine: the
//               very first cast (empty history: a new run, or a resumed one,
//               since checkpoints do not carry FP8 state) uses its own amax
//               instead of scale 1, which would flush small gradients to
//               zero in E5M2.
//
// Formats (Megatron's --fp8-format): e4m3 (every tensor E4M3) or hybrid
// (inputs and weights E4M3 in the forward, gradients E5M2 in the backward).

#include <deque>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/fp8.h"

namespace mcc {

enum class Fp8ScalingRecipe { kTensorwise, kDelayed };
enum class Fp8AmaxComputeAlgo { kMax, kMostRecent };

struct Fp8Recipe {
  Fp8Format forward_format = Fp8Format::kE4M3;   // Inputs and weights.
  Fp8Format backward_format = Fp8Format::kE4M3;  // Output gradients.
  Fp8ScalingRecipe recipe = Fp8ScalingRecipe::kDelayed;
  int margin = 0;
  int amax_history_len = 1;
  Fp8AmaxComputeAlgo amax_compute_algo = Fp8AmaxComputeAlgo::kMostRecent;
};

// From Megatron's flag values: format "e4m3" or "hybrid", recipe
// "tensorwise" or "delayed", algo "max" or "most_recent", history length
// >= 1, margin >= 0. Errors name the flag and the value.
absl::StatusOr<Fp8Recipe> MakeFp8Recipe(absl::string_view format,
                                        absl::string_view recipe, int margin,
                                        int amax_history_len,
                                        absl::string_view amax_compute_algo);

// "hybrid delayed (margin 0, amax history 1, most_recent)".
std::string DescribeFp8Recipe(const Fp8Recipe& recipe);

// (fp8_max / amax) / 2^margin, or previous_scale when amax is 0, negative
// or not finite.
float Fp8ScaleFromAmax(float amax, float fp8_max, int margin,
                       float previous_scale);

// The scaling state of one tensor (a layer's input, weight or output
// gradient) under a recipe. Not thread-safe; one per tensor role.
class Fp8TensorScaler {
 public:
  Fp8TensorScaler(const Fp8Recipe& recipe, Fp8Format format);

  // The scale for casting a tensor whose amax (reduced over every rank that
  // holds a piece of it) is `amax`; records the amax (delayed).
  float Next(float amax);

  Fp8Format format() const { return format_; }
  // The scale Next returned last (1 before any).
  float scale() const { return scale_; }
  // Recorded amaxes, most recent first (delayed; empty for tensorwise).
  const std::deque<float>& amax_history() const { return history_; }

 private:
  Fp8Recipe recipe_;
  Fp8Format format_;
  float scale_ = 1.0f;
  std::deque<float> history_;
};

}  // namespace mcc

#endif  // CORE_FP8_SCALING_H_
