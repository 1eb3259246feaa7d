#ifndef PARALLEL_FP8_LINEAR_H_
#define PARALLEL_FP8_LINEAR_H_

// The FP8 scaling state of one parallel linear layer (parallel/linear.h)
// under an FP8 recipe (core/fp8_scaling.h): one scaler each for its input,
// its weight and its output gradient, as TransformerEngine's Linear keeps.
//
// A tensor's amax is the maximum over every tensor-parallel rank that holds
// a piece of it (an all-reduce of one float over TP), so every layout casts
// with the serial model's scales and TP runs equal the serial one to fp32
// reduction order. Data-parallel replicas keep their own activation scales
// (their weight scales agree, the weights being equal): gradients are
// reduced in fp32 either way.
//
// The scale bookkeeping runs on the host: each cast reads its tensor's amax
// back (one float). On the CPU that is free; on a GPU it synchronises once
// per cast, which a device-side amax history and scale update would remove.

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/device.h"
#include "core/fp8_scaling.h"
#include "core/tensor.h"

namespace mcc {
namespace parallel {

// How one GEMM operand is cast: its format and its scale (fp32, one element,
// on the layer's device), as ops::Fp8Gemm takes them.
struct Fp8Operand {
  Fp8Format format = Fp8Format::kE4M3;
  Tensor scale;
};

class Fp8LinearScaling {
 public:
  // input_sharded / grad_sharded: whether TP ranks hold different pieces of
  // the GEMM's input / output gradient (their amaxes are then all-reduced
  // over tp_group; a replicated tensor's amax is already the same
  // everywhere). The weight is sharded whenever TP > 1.
  Fp8LinearScaling(const Fp8Recipe& recipe, comm::ProcessGroup* tp_group,
                   bool input_sharded, bool grad_sharded);

  absl::StatusOr<Fp8Operand> Input(const Tensor& x);
  absl::StatusOr<Fp8Operand> Weight(const Tensor& w);
  absl::StatusOr<Fp8Operand> OutputGrad(const Tensor& dy);

  const Fp8TensorScaler& input_scaler() const { return input_; }
  const Fp8TensorScaler& weight_scaler() const { return weight_; }
  const Fp8TensorScaler& grad_scaler() const { return grad_; }

 private:
  absl::StatusOr<Fp8Operand> Cast(Fp8TensorScaler* scaler, const Tensor& t,
                                  bool sharded);

  comm::ProcessGroup* tp_group_;
  bool input_sharded_, grad_sharded_;
  Fp8TensorScaler input_, weight_, grad_;
};

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_FP8_LINEAR_H_
