#include "parallel/mlp_block.h"

#include "core/ops/activation.h"
#include "core/status_macros.h"

namespace mcc {
namespace parallel {

absl::StatusOr<MlpBlock> MlpBlock::Create(const std::string& name,
                                          int64_t hidden, int64_t ffn_hidden,
                                          const LinearOptions& options,
                                          const LayerContext& context) {
  MlpBlock block;
  MCC_ASSIGN_OR_RETURN(
      block.fc1_, ColumnParallelLinear::Create(name + ".fc1", hidden,
                                               ffn_hidden, options, context));
  MCC_ASSIGN_OR_RETURN(
      block.fc2_, RowParallelLinear::Create(name + ".fc2", ffn_hidden, hidden,
                                            options, context));
  return block;
}

void MlpBlock::AppendParameters(ParameterList* params) const {
  fc1_->AppendParameters(params);
  fc2_->AppendParameters(params);
}

absl::StatusOr<Tensor> MlpBlock::Forward(const Tensor& x,
                                         Activations* act) const {
  MCC_ASSIGN_OR_RETURN(act->pre_gelu, fc1_->Forward(x, &act->fc1));
  Tensor g = Tensor::Empty(act->pre_gelu.shape(), DType::kFloat32,
                           act->pre_gelu.device());
  MCC_RETURN_IF_ERROR(ops::Gelu(act->pre_gelu, &g));
  return fc2_->Forward(g, &act->fc2);
}

absl::StatusOr<Tensor> MlpBlock::Backward(const Tensor& dy, Activations* act,
                                          DeferredWeightGrads* deferred) const {
  MCC_ASSIGN_OR_RETURN(Tensor dg, fc2_->Backward(dy, act->fc2, deferred));
  Tensor dh = Tensor::Empty(dg.shape(), DType::kFloat32, dg.device());
  MCC_RETURN_IF_ERROR(ops::GeluBackward(dg, act->pre_gelu, &dh));
  MCC_ASSIGN_OR_RETURN(Tensor dx, fc1_->Backward(dh, act->fc1, deferred));
  *act = Activations();
  return dx;
}

}  // namespace parallel
}  // namespace mcc
