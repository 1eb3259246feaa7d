#ifndef PARALLEL_MLP_BLOCK_H_
#define PARALLEL_MLP_BLOCK_H_

// The MLP of a residual block, fc2(gelu(fc1(x))), built from the parallel
// layers: fc1 a ColumnParallelLinear [hidden -> ffn_hidden] and fc2 a
// RowParallelLinear [ffn_hidden -> hidden], so the inner width splits over
// TP. The residual add (x + the block's output) is the caller's: it places
// it around its own unit hooks. fp32 only; no sequence parallelism. Models
// outside //models use it (parallel/testing's MlpStack, the
// examples/custom_model TinyLm); the GPT has its own MLP with fused bias
// kernels.
//
// Not thread-safe.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "parallel/linear.h"

namespace mcc {
namespace parallel {

class MlpBlock {
 public:
  // What Backward needs of a Forward.
  struct Activations {
    ColumnParallelLinear::Activations fc1;
    Tensor pre_gelu;
    RowParallelLinear::Activations fc2;
  };

  // Parameters named `name`.fc1.* and `name`.fc2.*.
  static absl::StatusOr<MlpBlock> Create(const std::string& name,
                                         int64_t hidden, int64_t ffn_hidden,
                                         const LinearOptions& options,
                                         const LayerContext& context);

  // fc1's parameters, then fc2's.
  void AppendParameters(ParameterList* params) const;

  // fc2(gelu(fc1(x))) for x [rows, hidden] fp32; fills *act.
  absl::StatusOr<Tensor> Forward(const Tensor& x, Activations* act) const;
  // The gradient of x from dy, the output's; accumulates the weights'
  // gradients into their main_grad and clears *act.
  // With `deferred`, the weight gradients are left to it (see
  // ColumnParallelLinear::Backward).
  absl::StatusOr<Tensor> Backward(
      const Tensor& dy, Activations* act,
      DeferredWeightGrads* deferred = nullptr) const;

 private:
  MlpBlock() = default;

  std::unique_ptr<ColumnParallelLinear> fc1_;
  std::unique_ptr<RowParallelLinear> fc2_;
};

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_MLP_BLOCK_H_
