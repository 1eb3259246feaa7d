#ifndef PARALLEL_LINEAR_H_
#define PARALLEL_LINEAR_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/comm/process_group.h"
#include "core/fp8_scaling.h"
#include "core/ops/fp8_weight.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "parallel/deferred_weight_grads.h"
#include "parallel/fp8_linear.h"
#include "parallel/init.h"

namespace mcc {
namespace parallel {

// What every parallel layer is built with.
struct LayerContext {
  comm::ProcessGroup* tp_group = nullptr;  // Null: serial.
  bool sequence_parallel = false;
  DType dtype = DType::kFloat32;  // Parameters and activations.
  uint64_t seed = 1234;           // Initialisation seed of the full tensors.
  // Where parameters, their main_grad, activations and every buffer the
  // layers allocate live. Inputs must be on it too (ops refuse a mix). The
  // layers reach its memory only through kernels, collectives and the
  // device's copy hook (initial values are drawn on the host and copied).
  Device device = Device::CPU();
  // Context parallelism: the group over which the sequence is split (null
  // or size 1: none; each rank then holds chunks i and 2C - 1 - i of every
  // sequence, parallel/context_parallel/chunk_layout.h) and how attention
  // crosses it.
  comm::ProcessGroup* cp_group = nullptr;
  enum class CpCommType { kP2P, kAllToAll };
  CpCommType cp_comm_type = CpCommType::kP2P;
  // FP8 training (Megatron's --fp8-format): when set, the linear layers'
  // three GEMMs run through ops::Fp8Gemm with this recipe's scaling
  // (parallel/fp8_linear.h). Parameters, their main_grad and everything
  // else keep `dtype`. Null: no FP8.
  std::optional<Fp8Recipe> fp8;
  // Mixture-of-experts layers: laid out over the experts' ranks
  // (ParallelState's expert groups, Megatron's expert layout) when
  // expert_layout is set: the EP group (experts split over it, tokens
  // dispatched by all-to-all or all-gather), the ETP group (each expert's
  // ffn split over it); null or size 1: none. Without expert_layout the
  // experts are whole and replicated like the dense weights.
  bool expert_layout = false;
  comm::ProcessGroup* expert_model_group = nullptr;
  comm::ProcessGroup* expert_tensor_group = nullptr;
  bool moe_alltoall_dispatcher =
      false;  // Else all-gather (Megatron's default).
};

struct LinearOptions {
  bool bias = true;
  InitSpec weight_init = InitSpec::Normal(0.02f);
  // Column: all-gather the output's last dimension (Megatron's gather_output).
  bool gather_output = false;
  // Return y without the bias; the caller adds it (fused with what follows,
  // e.g. bias-GELU) and accumulates the bias gradient itself.
  bool skip_bias_add = false;
  // Column-parallel only: the output is `stacked` matrices one above the
  // other (SwiGLU's gate and up projections: 2). The weight's global shape
  // is then [stacked, out / stacked, in], split along dimension 1, so each
  // rank holds its slice of every matrix and any TP size reshards.
  int stacked = 1;
};

// A linear layer's weight in weight-only int8 (core/ops/int8_gemm.h): q
// holds int8 values with the weight's global shape and split; scales holds
// fp32 per-output-row scales with the weight's shape minus its last
// dimension ([out], or [stacked, out / stacked]), split as the weight's rows
// are (replicated for a row-parallel layer, whose split is along `in`). The
// checkpoint names are the weight's ("<layer>.weight") and
// "<layer>.weight_scale".
struct Int8Weight {
  std::shared_ptr<Parameter> q;
  std::shared_ptr<Parameter> scales;
};

// A linear layer's weight in weight-only FP8 for inference
// (core/ops/fp8_weight.h): the same two tensors, shaped and split as
// Int8Weight's, q holding E4M3 codes (one byte each) and scales the fp32
// scales (448 / the row's or the whole weight's maximum).
using Fp8Weight = Int8Weight;

// How a layer turns int8 (see Int8Weight). Either way Forward then runs the
// int8 GEMM, Backward fails, and the weight's value and main_grad are
// released (Parameter::value undefined): the layer serves inference only.
enum class Int8Source {
  // Quantise the loaded weight per output row (core/ops/int8_quantize.h).
  // Collective over TP for a row-parallel layer: the row maxima are
  // all-reduced, so every layout gets the serial model's q and scales.
  kQuantizeWeight,
  // Allocate q and scales (zeros) to be loaded from a quantised checkpoint.
  kLoadLater,
};

// Y = X W^T + b with W [out, in] split along `out` across tensor-parallel
// ranks (Megatron's ColumnParallelLinear). X is [tokens, in]: replicated over
// TP, or under sequence parallelism this rank's [tokens / TP, in], gathered
// before the GEMM. The backward reduces the input gradient over TP
// (reduce-scatter under SP) asynchronously while the weight gradient GEMM
// runs; weight gradients accumulate into the parameters' fp32 main_grad.
class ColumnParallelLinear {
 public:
  struct Activations {
    Tensor input;  // As given to Forward (the local chunk under SP).
    // Under FP8: how the forward cast the input and the weight, reused by
    // the backward's GEMMs (as TransformerEngine reuses its FP8 copies).
    Fp8Operand input_fp8, weight_fp8;
  };

  static absl::StatusOr<std::unique_ptr<ColumnParallelLinear>> Create(
      const std::string& name, int64_t in_features, int64_t out_features,
      const LinearOptions& options, const LayerContext& context);

  // The same layer over an existing weight [out / TP, in] (the output layer
  // tied to the word embedding); no bias.
  static absl::StatusOr<std::unique_ptr<ColumnParallelLinear>> CreateTied(
      const std::string& name, std::shared_ptr<Parameter> weight,
      const LayerContext& context);

  absl::StatusOr<Tensor> Forward(const Tensor& x, Activations* act) const;
  // dy: [tokens, out / TP] (or [tokens, out] with gather_output). With
  // `deferred`, the weight and bias gradients are left to it (holding dy and
  // the input, gathered under SP) and only the input gradient is computed.
  absl::StatusOr<Tensor> Backward(
      const Tensor& dy, const Activations& act,
      DeferredWeightGrads* deferred = nullptr) const;

  const std::shared_ptr<Parameter>& weight() const { return weight_; }
  const std::shared_ptr<Parameter>& bias() const { return bias_; }
  // A weight-shaped (bias-shaped) tensor as the GEMM's [out / TP, in]
  // matrix ([out / TP] vector): a zero-copy view.
  absl::StatusOr<Tensor> Matrix(const Tensor& t) const;
  absl::StatusOr<Tensor> Vector(const Tensor& t) const;
  // The parameters this layer owns (a tied weight belongs to its owner).
  void AppendParameters(ParameterList* out) const;
  int64_t local_out_features() const { return local_out_; }

  // Weight-only int8 inference (see Int8Source); not for a tied weight.
  absl::Status ConvertToInt8(Int8Source source);
  // Null until ConvertToInt8.
  const Int8Weight* int8_weight() const { return int8_.q ? &int8_ : nullptr; }
  // Weight-only FP8 inference, quantising the loaded weight (per tensor:
  // the maximum is all-reduced over TP, which splits the rows). Forward
  // then runs ops::Fp8WeightGemm, Backward fails and the dense weight is
  // released, as ConvertToInt8. Not for a tied weight.
  absl::Status ConvertToFp8(ops::Fp8WeightScaling scaling);
  // Null until ConvertToFp8.
  const Fp8Weight* fp8_weight() const { return fp8w_.q ? &fp8w_ : nullptr; }
  // The FP8 scaling state (LayerContext::fp8); null without FP8.
  const Fp8LinearScaling* fp8() const { return fp8_.get(); }

 private:
  std::string name_;
  int64_t in_ = 0;
  int64_t local_out_ = 0;
  LinearOptions options_;
  LayerContext context_;
  std::shared_ptr<Parameter> weight_;
  std::shared_ptr<Parameter> bias_;
  bool tied_ = false;
  Int8Weight int8_;
  Fp8Weight fp8w_;
  // Mutable state of const Forward/Backward: the amax histories.
  std::unique_ptr<Fp8LinearScaling> fp8_;
};

// Y = X W^T + b with W [out, in] split along `in` (Megatron's
// RowParallelLinear, input_is_parallel): X is [tokens, in / TP]; the partial
// products are all-reduced (reduce-scattered along tokens under SP) and the
// replicated bias added after.
class RowParallelLinear {
 public:
  struct Activations {
    Tensor input;
    Fp8Operand input_fp8, weight_fp8;  // Under FP8, as the column layer's.
  };

  static absl::StatusOr<std::unique_ptr<RowParallelLinear>> Create(
      const std::string& name, int64_t in_features, int64_t out_features,
      const LinearOptions& options, const LayerContext& context);

  absl::StatusOr<Tensor> Forward(const Tensor& x, Activations* act) const;
  // With `deferred`, as ColumnParallelLinear::Backward's.
  absl::StatusOr<Tensor> Backward(
      const Tensor& dy, const Activations& act,
      DeferredWeightGrads* deferred = nullptr) const;

  const std::shared_ptr<Parameter>& weight() const { return weight_; }
  const std::shared_ptr<Parameter>& bias() const { return bias_; }
  void AppendParameters(ParameterList* out) const;

  // Weight-only int8 inference (see Int8Source).
  absl::Status ConvertToInt8(Int8Source source);
  // Null until ConvertToInt8.
  const Int8Weight* int8_weight() const { return int8_.q ? &int8_ : nullptr; }
  // Weight-only FP8 inference, as the column layer's (the row maxima are
  // all-reduced over TP, which splits the columns).
  absl::Status ConvertToFp8(ops::Fp8WeightScaling scaling);
  const Fp8Weight* fp8_weight() const { return fp8w_.q ? &fp8w_ : nullptr; }
  const Fp8LinearScaling* fp8() const { return fp8_.get(); }

 private:
  std::string name_;
  int64_t local_in_ = 0;
  int64_t out_ = 0;
  LinearOptions options_;
  LayerContext context_;
  std::shared_ptr<Parameter> weight_;
  std::shared_ptr<Parameter> bias_;
  Int8Weight int8_;
  Fp8Weight fp8w_;
  std::unique_ptr<Fp8LinearScaling> fp8_;
};

// Builds a Parameter from this rank's piece of a deterministically
// initialised full tensor; value and main_grad (an fp32 zero buffer) live on
// context.device.
absl::StatusOr<std::shared_ptr<Parameter>> MakeParameter(
    const std::string& name, const Shape& global_shape, int partition_dim,
    const InitSpec& init, const LayerContext& context, bool weight_decay);

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_LINEAR_H_
