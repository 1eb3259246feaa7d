#include "parallel/linear.h"

#include "absl/strings/str_cat.h"
#include "core/ops/abs_max.h"
#include "core/ops/bias.h"
#include "core/ops/fp8_gemm.h"
#include "core/ops/fp8_weight.h"
#include "core/ops/gemm.h"
#include "core/ops/int8_gemm.h"
#include "core/ops/int8_quantize.h"
#include "core/status_macros.h"
#include "parallel/mappings.h"

namespace mcc {
namespace parallel {

absl::StatusOr<std::shared_ptr<Parameter>> MakeParameter(
    const std::string& name, const Shape& global_shape, int partition_dim,
    const InitSpec& init, const LayerContext& context, bool weight_decay) {
  const int tp = GroupSize(context.tp_group);
  const int rank = GroupRank(context.tp_group);
  auto p = std::make_shared<Parameter>();
  p->name = name;
  p->global_shape = global_shape;
  p->partition_dim = tp > 1 ? partition_dim : -1;
  p->partition_rank = tp > 1 && partition_dim >= 0 ? rank : 0;
  p->partition_count = tp > 1 && partition_dim >= 0 ? tp : 1;
  p->weight_decay = weight_decay;
  MCC_ASSIGN_OR_RETURN(
      p->value, InitShard(name, context.seed, init, global_shape,
                          p->partition_dim, p->partition_rank,
                          p->partition_count, context.dtype, context.device));
  p->main_grad =
      Tensor::Zeros(p->value.shape(), DType::kFloat32, context.device);
  return p;
}

namespace {

absl::Status CheckInput(const std::string& layer, const Tensor& x,
                        int64_t features) {
  if (x.dim() != 2 || x.size(1) != features) {
    return absl::InvalidArgumentError(absl::StrCat(
        layer, ": input ", x.Describe(), " is not [tokens, ", features, "]"));
  }
  return absl::OkStatus();
}

// q and scales shaped and split like `w` (see Int8Weight), zero.
Int8Weight MakeInt8Weight(const Parameter& w) {
  Int8Weight out;
  out.q = std::make_shared<Parameter>();
  Parameter& q = *out.q;
  q.name = w.name;
  q.global_shape = w.global_shape;
  q.partition_dim = w.partition_dim;
  q.partition_rank = w.partition_rank;
  q.partition_count = w.partition_count;
  q.weight_decay = false;
  q.value = Tensor::Zeros(w.value.shape(), DType::kInt8, w.value.device());
  out.scales = std::make_shared<Parameter>();
  Parameter& s = *out.scales;
  s.name = w.name + "_scale";
  const int rows_dims = static_cast<int>(w.global_shape.size()) - 1;
  s.global_shape = Shape(w.global_shape.begin(), w.global_shape.end() - 1);
  // A split along the columns (row-parallel) leaves whole rows: replicated.
  if (w.partition_dim >= 0 && w.partition_dim < rows_dims) {
    s.partition_dim = w.partition_dim;
    s.partition_rank = w.partition_rank;
    s.partition_count = w.partition_count;
  }
  s.weight_decay = false;
  const Shape local = w.value.shape();
  s.value = Tensor::Zeros(Shape(local.begin(), local.end() - 1),
                          DType::kFloat32, w.value.device());
  return out;
}

// Quantises the weight matrix w [rows, cols] into q [rows, cols] and
// scales [rows]; the row maxima are all-reduced over `row_group` (the ranks
// that hold the other columns of the same rows), when given.
absl::Status QuantizeMatrix(const Tensor& w, comm::ProcessGroup* row_group,
                            Tensor q, Tensor scales) {
  Tensor absmax = Tensor::Empty({w.size(0)}, DType::kFloat32, w.device());
  MCC_RETURN_IF_ERROR(ops::RowAbsMax(w, &absmax));
  if (GroupSize(row_group) > 1) {
    MCC_RETURN_IF_ERROR(
        row_group->AllReduceSync(&absmax, comm::ReduceOp::kMax));
  }
  return ops::QuantizeRowsInt8(w, absmax, &q, &scales);
}

absl::Status CheckNotInt8(const std::string& layer, const Int8Weight& int8) {
  if (int8.q == nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      layer, ": its weight is int8 (inference only); there is no backward"));
}

absl::Status CheckNotFp8(const std::string& layer, const Fp8Weight& fp8) {
  if (fp8.q == nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      layer, ": its weight is FP8 (inference only); there is no backward"));
}

absl::Status CheckNotQuantized(const std::string& layer, const Int8Weight& int8,
                               const Fp8Weight& fp8) {
  if (int8.q != nullptr || fp8.q != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(layer, ": already ", int8.q != nullptr ? "int8" : "FP8"));
  }
  return absl::OkStatus();
}

// E4M3 codes and scales of the weight matrix w [rows, cols]: row maxima
// all-reduced over `row_group` (the ranks holding the rows' other columns);
// per tensor, their maximum all-reduced over `rows_group` (the ranks holding
// the other rows) in every entry.
absl::Status QuantizeMatrixFp8(const Tensor& w, comm::ProcessGroup* row_group,
                               comm::ProcessGroup* rows_group,
                               ops::Fp8WeightScaling scaling, Tensor q,
                               Tensor scales) {
  Tensor absmax = Tensor::Empty({w.size(0)}, DType::kFloat32, w.device());
  MCC_RETURN_IF_ERROR(ops::RowAbsMax(w, &absmax));
  if (GroupSize(row_group) > 1) {
    MCC_RETURN_IF_ERROR(
        row_group->AllReduceSync(&absmax, comm::ReduceOp::kMax));
  }
  if (scaling == ops::Fp8WeightScaling::kPerTensor) {
    Tensor m = Tensor::Empty({1}, DType::kFloat32, w.device());
    MCC_RETURN_IF_ERROR(ops::AbsMax(absmax, &m));
    if (GroupSize(rows_group) > 1) {
      MCC_RETURN_IF_ERROR(rows_group->AllReduceSync(&m, comm::ReduceOp::kMax));
    }
    absmax.Fill(m.ToDoubles()[0]);
  }
  return ops::QuantizeWeightFp8(w, absmax, &q, &scales);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ColumnParallelLinear>>
ColumnParallelLinear::Create(const std::string& name, int64_t in_features,
                             int64_t out_features, const LinearOptions& options,
                             const LayerContext& context) {
  const int tp = GroupSize(context.tp_group);
  const int stacked = std::max(1, options.stacked);
  if (out_features % (tp * stacked) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": output size ", out_features,
        " is not divisible by the tensor-parallel size ", tp,
        stacked > 1 ? absl::StrCat(" x ", stacked, " stacked matrices") : ""));
  }
  auto layer = std::unique_ptr<ColumnParallelLinear>(new ColumnParallelLinear);
  layer->name_ = name;
  layer->in_ = in_features;
  layer->local_out_ = out_features / tp;
  layer->options_ = options;
  layer->context_ = context;
  const Shape weight_shape =
      stacked > 1 ? Shape{stacked, out_features / stacked, in_features}
                  : Shape{out_features, in_features};
  const Shape bias_shape = stacked > 1 ? Shape{stacked, out_features / stacked}
                                       : Shape{out_features};
  const int split_dim = stacked > 1 ? 1 : 0;
  MCC_ASSIGN_OR_RETURN(
      layer->weight_,
      MakeParameter(name + ".weight", weight_shape, split_dim,
                    options.weight_init, context, /*weight_decay=*/true));
  if (options.bias) {
    MCC_ASSIGN_OR_RETURN(layer->bias_,
                         MakeParameter(name + ".bias", bias_shape, split_dim,
                                       InitSpec::Zeros(), context, false));
  }
  if (context.fp8.has_value()) {
    // The input is replicated (or gathered whole under SP); the output
    // gradient holds this rank's columns.
    layer->fp8_ = std::make_unique<Fp8LinearScaling>(
        *context.fp8, context.tp_group, /*input_sharded=*/false,
        /*grad_sharded=*/true);
  }
  return layer;
}

absl::StatusOr<Tensor> ColumnParallelLinear::Matrix(const Tensor& t) const {
  return t.Reshape({local_out_, in_});
}

absl::StatusOr<Tensor> ColumnParallelLinear::Vector(const Tensor& t) const {
  return t.Reshape({local_out_});
}

absl::StatusOr<std::unique_ptr<ColumnParallelLinear>>
ColumnParallelLinear::CreateTied(const std::string& name,
                                 std::shared_ptr<Parameter> weight,
                                 const LayerContext& context) {
  auto layer = std::unique_ptr<ColumnParallelLinear>(new ColumnParallelLinear);
  layer->name_ = name;
  layer->in_ = weight->value.size(1);
  layer->local_out_ = weight->value.size(0);
  layer->options_.bias = false;
  layer->context_ = context;
  layer->weight_ = std::move(weight);
  layer->tied_ = true;
  return layer;
}

absl::StatusOr<Tensor> ColumnParallelLinear::Forward(const Tensor& x,
                                                     Activations* act) const {
  MCC_RETURN_IF_ERROR(CheckInput(name_, x, in_));
  comm::ProcessGroup* g = context_.tp_group;
  Tensor full = x;
  if (context_.sequence_parallel) {
    MCC_ASSIGN_OR_RETURN(full, GatherFromSequenceParallelRegion::Forward(g, x));
  }
  Tensor y = Tensor::Empty({full.size(0), local_out_}, x.dtype(), x.device());
  if (int8_.q != nullptr) {
    MCC_ASSIGN_OR_RETURN(Tensor q, Matrix(int8_.q->value));
    MCC_ASSIGN_OR_RETURN(Tensor scales, Vector(int8_.scales->value));
    MCC_RETURN_IF_ERROR(ops::Int8Gemm(full, q, scales, &y));
  } else if (fp8w_.q != nullptr) {
    MCC_ASSIGN_OR_RETURN(Tensor q, Matrix(fp8w_.q->value));
    MCC_ASSIGN_OR_RETURN(Tensor scales, Vector(fp8w_.scales->value));
    MCC_RETURN_IF_ERROR(ops::Fp8WeightGemm(full, q, scales, &y));
  } else if (fp8_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(Tensor w, Matrix(weight_->value));
    MCC_ASSIGN_OR_RETURN(act->input_fp8, fp8_->Input(full));
    MCC_ASSIGN_OR_RETURN(act->weight_fp8, fp8_->Weight(w));
    MCC_RETURN_IF_ERROR(ops::Fp8Gemm(
        full, false, act->input_fp8.format, act->input_fp8.scale, w, true,
        act->weight_fp8.format, act->weight_fp8.scale, &y));
  } else {
    MCC_ASSIGN_OR_RETURN(Tensor w, Matrix(weight_->value));
    MCC_RETURN_IF_ERROR(ops::Gemm(full, false, w, true, &y));
  }
  if (bias_ != nullptr && !options_.skip_bias_add) {
    MCC_ASSIGN_OR_RETURN(Tensor b, Vector(bias_->value));
    MCC_RETURN_IF_ERROR(ops::BiasAdd(y, b, &y));
  }
  act->input = x;
  if (options_.gather_output) {
    return GatherFromTensorParallelRegion::Forward(g, y);
  }
  return y;
}

absl::StatusOr<Tensor> ColumnParallelLinear::Backward(
    const Tensor& dy_in, const Activations& act,
    DeferredWeightGrads* deferred) const {
  MCC_RETURN_IF_ERROR(CheckNotInt8(name_, int8_));
  MCC_RETURN_IF_ERROR(CheckNotFp8(name_, fp8w_));
  comm::ProcessGroup* g = context_.tp_group;
  Tensor dy = dy_in;
  if (options_.gather_output) {
    MCC_ASSIGN_OR_RETURN(dy,
                         GatherFromTensorParallelRegion::Backward(g, dy_in));
  }
  // Under SP the full input is gathered again (not kept from the forward),
  // overlapped with the input-gradient GEMM.
  Tensor full = act.input;
  std::shared_ptr<comm::Work> gather;
  const bool sp = context_.sequence_parallel && GroupSize(g) > 1;
  if (sp) {
    full = Tensor::Empty({act.input.size(0) * g->size(), in_},
                         act.input.dtype(), act.input.device());
    gather = g->AllGather(act.input, &full);
  }
  if (dy.dim() != 2 || dy.size(1) != local_out_) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": output gradient ", dy.Describe(),
                     " is not [tokens, ", local_out_, "]"));
  }
  Tensor dx_full = Tensor::Empty({dy.size(0), in_}, dy.dtype(), dy.device());
  MCC_ASSIGN_OR_RETURN(Tensor w, Matrix(weight_->value));
  Fp8Operand dy_fp8;
  if (fp8_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(dy_fp8, fp8_->OutputGrad(dy));
    MCC_RETURN_IF_ERROR(ops::Fp8Gemm(dy, false, dy_fp8.format, dy_fp8.scale, w,
                                     false, act.weight_fp8.format,
                                     act.weight_fp8.scale, &dx_full));
  } else {
    MCC_RETURN_IF_ERROR(ops::Gemm(dy, false, w, false, &dx_full));
  }
  // The input gradient's reduction runs while the weight gradient computes.
  std::shared_ptr<comm::Work> reduce;
  Tensor dx = dx_full;
  if (sp) {
    MCC_RETURN_IF_ERROR(gather->Wait());
    dx = Tensor::Empty(act.input.shape(), dy.dtype(), dy.device());
    reduce = g->ReduceScatter(dx_full, &dx, comm::ReduceOp::kSum);
  } else if (GroupSize(g) > 1) {
    reduce = g->AllReduce(&dx, comm::ReduceOp::kSum);
  }
  // The weight (and bias) gradient, read from main_grad when it runs.
  auto weight_grads = [this, dy, full, dy_fp8,
                       input_fp8 = act.input_fp8]() -> absl::Status {
    MCC_ASSIGN_OR_RETURN(Tensor dw, Matrix(weight_->main_grad));
    if (fp8_ != nullptr) {
      MCC_RETURN_IF_ERROR(ops::Fp8Gemm(dy, true, dy_fp8.format, dy_fp8.scale,
                                       full, false, input_fp8.format,
                                       input_fp8.scale, &dw, 1.0f, 1.0f));
    } else {
      MCC_RETURN_IF_ERROR(ops::Gemm(dy, true, full, false, &dw, 1.0f, 1.0f));
    }
    // With skip_bias_add the caller added the bias, and owns its gradient.
    if (bias_ != nullptr && !options_.skip_bias_add) {
      MCC_ASSIGN_OR_RETURN(Tensor db, Vector(bias_->main_grad));
      MCC_RETURN_IF_ERROR(ops::BiasAddBackward(dy, &db));
    }
    return absl::OkStatus();
  };
  if (deferred != nullptr) {
    deferred->Add(std::move(weight_grads));
  } else {
    MCC_RETURN_IF_ERROR(weight_grads());
  }
  if (reduce != nullptr) MCC_RETURN_IF_ERROR(reduce->Wait());
  return dx;
}

void ColumnParallelLinear::AppendParameters(ParameterList* out) const {
  if (!tied_) out->push_back(weight_);
  if (bias_ != nullptr) out->push_back(bias_);
}

absl::Status ColumnParallelLinear::ConvertToInt8(Int8Source source) {
  if (tied_) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, ": a tied weight (the word embedding's) stays unquantised"));
  }
  MCC_RETURN_IF_ERROR(CheckNotQuantized(name_, int8_, fp8w_));
  Int8Weight int8 = MakeInt8Weight(*weight_);
  if (source == Int8Source::kQuantizeWeight) {
    // Rows are whole on every rank: no collective.
    MCC_ASSIGN_OR_RETURN(Tensor w, Matrix(weight_->value));
    MCC_ASSIGN_OR_RETURN(Tensor q, Matrix(int8.q->value));
    MCC_ASSIGN_OR_RETURN(Tensor scales, Vector(int8.scales->value));
    MCC_RETURN_IF_ERROR(QuantizeMatrix(w, nullptr, q, scales));
  }
  int8_ = std::move(int8);
  weight_->value = Tensor();
  weight_->main_grad = Tensor();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RowParallelLinear>> RowParallelLinear::Create(
    const std::string& name, int64_t in_features, int64_t out_features,
    const LinearOptions& options, const LayerContext& context) {
  const int tp = GroupSize(context.tp_group);
  if (in_features % tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": input size ", in_features,
                     " is not divisible by the tensor-parallel size ", tp));
  }
  auto layer = std::unique_ptr<RowParallelLinear>(new RowParallelLinear);
  layer->name_ = name;
  layer->local_in_ = in_features / tp;
  layer->out_ = out_features;
  layer->options_ = options;
  layer->context_ = context;
  MCC_ASSIGN_OR_RETURN(
      layer->weight_,
      MakeParameter(name + ".weight", {out_features, in_features}, 1,
                    options.weight_init, context, /*weight_decay=*/true));
  if (options.bias) {
    MCC_ASSIGN_OR_RETURN(layer->bias_,
                         MakeParameter(name + ".bias", {out_features}, -1,
                                       InitSpec::Zeros(), context, false));
    // Under SP each rank sees a different part of the sequence, so the bias
    // gradient is partial and is summed over TP before the optimizer.
    layer->bias_->sequence_parallel =
        context.sequence_parallel && GroupSize(context.tp_group) > 1;
  }
  if (context.fp8.has_value()) {
    // The input holds this rank's columns; the output gradient is
    // replicated (gathered whole under SP before the GEMMs).
    layer->fp8_ = std::make_unique<Fp8LinearScaling>(
        *context.fp8, context.tp_group, /*input_sharded=*/true,
        /*grad_sharded=*/false);
  }
  return layer;
}

absl::StatusOr<Tensor> RowParallelLinear::Forward(const Tensor& x,
                                                  Activations* act) const {
  MCC_RETURN_IF_ERROR(CheckInput(name_, x, local_in_));
  comm::ProcessGroup* g = context_.tp_group;
  Tensor partial = Tensor::Empty({x.size(0), out_}, x.dtype(), x.device());
  if (int8_.q != nullptr) {
    MCC_RETURN_IF_ERROR(
        ops::Int8Gemm(x, int8_.q->value, int8_.scales->value, &partial));
  } else if (fp8w_.q != nullptr) {
    MCC_RETURN_IF_ERROR(
        ops::Fp8WeightGemm(x, fp8w_.q->value, fp8w_.scales->value, &partial));
  } else if (fp8_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(act->input_fp8, fp8_->Input(x));
    MCC_ASSIGN_OR_RETURN(act->weight_fp8, fp8_->Weight(weight_->value));
    MCC_RETURN_IF_ERROR(ops::Fp8Gemm(
        x, false, act->input_fp8.format, act->input_fp8.scale, weight_->value,
        true, act->weight_fp8.format, act->weight_fp8.scale, &partial));
  } else {
    MCC_RETURN_IF_ERROR(ops::Gemm(x, false, weight_->value, true, &partial));
  }
  Tensor y;
  if (context_.sequence_parallel) {
    MCC_ASSIGN_OR_RETURN(
        y, ReduceScatterToSequenceParallelRegion::Forward(g, partial));
  } else {
    if (GroupSize(g) > 1) {
      MCC_RETURN_IF_ERROR(g->AllReduceSync(&partial, comm::ReduceOp::kSum));
    }
    y = partial;
  }
  if (bias_ != nullptr && !options_.skip_bias_add) {
    MCC_RETURN_IF_ERROR(ops::BiasAdd(y, bias_->value, &y));
  }
  act->input = x;
  return y;
}

absl::StatusOr<Tensor> RowParallelLinear::Backward(
    const Tensor& dy_in, const Activations& act,
    DeferredWeightGrads* deferred) const {
  MCC_RETURN_IF_ERROR(CheckNotInt8(name_, int8_));
  MCC_RETURN_IF_ERROR(CheckNotFp8(name_, fp8w_));
  comm::ProcessGroup* g = context_.tp_group;
  if (bias_ != nullptr && !options_.skip_bias_add) {
    auto bias_grad = [this, dy_in]() {
      return ops::BiasAddBackward(dy_in, &bias_->main_grad);
    };
    if (deferred != nullptr) {
      deferred->Add(std::move(bias_grad));
    } else {
      MCC_RETURN_IF_ERROR(bias_grad());
    }
  }
  Tensor dy = dy_in;
  if (context_.sequence_parallel) {
    MCC_ASSIGN_OR_RETURN(
        dy, ReduceScatterToSequenceParallelRegion::Backward(g, dy_in));
  }
  if (dy.dim() != 2 || dy.size(1) != out_ || dy.size(0) != act.input.size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name_, ": output gradient ", dy.Describe(),
                     " does not match input ", act.input.Describe()));
  }
  Tensor dx = Tensor::Empty(act.input.shape(), dy.dtype(), dy.device());
  Fp8Operand dy_fp8;
  if (fp8_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(dy_fp8, fp8_->OutputGrad(dy));
    MCC_RETURN_IF_ERROR(
        ops::Fp8Gemm(dy, false, dy_fp8.format, dy_fp8.scale, weight_->value,
                     false, act.weight_fp8.format, act.weight_fp8.scale, &dx));
  } else {
    MCC_RETURN_IF_ERROR(ops::Gemm(dy, false, weight_->value, false, &dx));
  }
  auto weight_grad = [this, dy, input = act.input, dy_fp8,
                      input_fp8 = act.input_fp8]() {
    if (fp8_ != nullptr) {
      return ops::Fp8Gemm(dy, true, dy_fp8.format, dy_fp8.scale, input, false,
                          input_fp8.format, input_fp8.scale,
                          &weight_->main_grad, 1.0f, 1.0f);
    }
    return ops::Gemm(dy, true, input, false, &weight_->main_grad, 1.0f, 1.0f);
  };
  if (deferred != nullptr) {
    deferred->Add(std::move(weight_grad));
  } else {
    MCC_RETURN_IF_ERROR(weight_grad());
  }
  return dx;
}

void RowParallelLinear::AppendParameters(ParameterList* out) const {
  out->push_back(weight_);
  if (bias_ != nullptr) out->push_back(bias_);
}

absl::Status RowParallelLinear::ConvertToInt8(Int8Source source) {
  MCC_RETURN_IF_ERROR(CheckNotQuantized(name_, int8_, fp8w_));
  Int8Weight int8 = MakeInt8Weight(*weight_);
  if (source == Int8Source::kQuantizeWeight) {
    // Each rank holds a slice of every row: the row maxima are the
    // maxima over TP (collective), so any layout quantises alike.
    MCC_RETURN_IF_ERROR(QuantizeMatrix(weight_->value, context_.tp_group,
                                       int8.q->value, int8.scales->value));
  }
  int8_ = std::move(int8);
  weight_->value = Tensor();
  weight_->main_grad = Tensor();
  return absl::OkStatus();
}

absl::Status ColumnParallelLinear::ConvertToFp8(ops::Fp8WeightScaling scaling) {
  if (tied_) {
    return absl::FailedPreconditionError(absl::StrCat(
        name_, ": a tied weight (the word embedding's) stays unquantised"));
  }
  MCC_RETURN_IF_ERROR(CheckNotQuantized(name_, int8_, fp8w_));
  Fp8Weight fp8 = MakeInt8Weight(*weight_);
  MCC_ASSIGN_OR_RETURN(Tensor w, Matrix(weight_->value));
  MCC_ASSIGN_OR_RETURN(Tensor q, Matrix(fp8.q->value));
  MCC_ASSIGN_OR_RETURN(Tensor scales, Vector(fp8.scales->value));
  // Rows are whole on every rank; TP splits the rows.
  MCC_RETURN_IF_ERROR(
      QuantizeMatrixFp8(w, nullptr, context_.tp_group, scaling, q, scales));
  fp8w_ = std::move(fp8);
  weight_->value = Tensor();
  weight_->main_grad = Tensor();
  return absl::OkStatus();
}

absl::Status RowParallelLinear::ConvertToFp8(ops::Fp8WeightScaling scaling) {
  MCC_RETURN_IF_ERROR(CheckNotQuantized(name_, int8_, fp8w_));
  Fp8Weight fp8 = MakeInt8Weight(*weight_);
  // TP splits the columns: the row maxima are reduced over it, and then
  // every rank holds every row's maximum.
  MCC_RETURN_IF_ERROR(QuantizeMatrixFp8(weight_->value, context_.tp_group,
                                        nullptr, scaling, fp8.q->value,
                                        fp8.scales->value));
  fp8w_ = std::move(fp8);
  weight_->value = Tensor();
  weight_->main_grad = Tensor();
  return absl::OkStatus();
}

}  // namespace parallel
}  // namespace mcc
