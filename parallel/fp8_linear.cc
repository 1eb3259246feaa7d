#include "parallel/fp8_linear.h"

#include "core/ops/abs_max.h"
#include "core/status_macros.h"
#include "parallel/mappings.h"

namespace mcc {
namespace parallel {

Fp8LinearScaling::Fp8LinearScaling(const Fp8Recipe& recipe,
                                   comm::ProcessGroup* tp_group,
                                   bool input_sharded, bool grad_sharded)
    : tp_group_(tp_group),
      input_sharded_(input_sharded),
      grad_sharded_(grad_sharded),
      input_(recipe, recipe.forward_format),
      weight_(recipe, recipe.forward_format),
      grad_(recipe, recipe.backward_format) {}

absl::StatusOr<Fp8Operand> Fp8LinearScaling::Input(const Tensor& x) {
  return Cast(&input_, x, input_sharded_);
}

absl::StatusOr<Fp8Operand> Fp8LinearScaling::Weight(const Tensor& w) {
  return Cast(&weight_, w, /*sharded=*/true);
}

absl::StatusOr<Fp8Operand> Fp8LinearScaling::OutputGrad(const Tensor& dy) {
  return Cast(&grad_, dy, grad_sharded_);
}

absl::StatusOr<Fp8Operand> Fp8LinearScaling::Cast(Fp8TensorScaler* scaler,
                                                  const Tensor& t,
                                                  bool sharded) {
  Tensor amax = Tensor::Empty({1}, DType::kFloat32, t.device());
  MCC_RETURN_IF_ERROR(ops::AbsMax(t, &amax));
  if (sharded && GroupSize(tp_group_) > 1) {
    MCC_RETURN_IF_ERROR(tp_group_->AllReduceSync(&amax, comm::ReduceOp::kMax));
  }
  const float scale = scaler->Next(static_cast<float>(amax.ToDoubles()[0]));
  Fp8Operand out;
  out.format = scaler->format();
  out.scale = Tensor::Full({1}, scale, DType::kFloat32, t.device());
  return out;
}

}  // namespace parallel
}  // namespace mcc
