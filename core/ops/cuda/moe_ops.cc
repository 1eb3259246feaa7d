#include "core/ops/cuda/moe_ops.h"

#include "core/ops/cuda/launch.h"
#include "core/ops/cuda/moe.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

namespace k = ::mcc::cuda_kernels;

const float* F32(const Tensor& t) {
  return static_cast<const float*>(t.raw_data());
}
float* F32(Tensor* t) { return static_cast<float*>(t->raw_data()); }
const int32_t* I32(const Tensor& t) {
  return static_cast<const int32_t*>(t.raw_data());
}
int32_t* I32(Tensor* t) { return static_cast<int32_t*>(t->raw_data()); }

k::MoeRouterArgs RouterArgs(const Tensor& token_by_expert,
                            const MoeRouterOptions& o) {
  k::MoeRouterArgs a;
  a.tokens = token_by_expert.size(0);
  a.experts = token_by_expert.size(1);
  a.topk = o.topk;
  a.sigmoid = o.score_function == MoeScoreFunction::kSigmoid;
  a.normalize = o.normalize_topk;
  a.scaling = o.scaling_factor;
  return a;
}

k::MoeBalanceArgs BalanceArgs(const Tensor& scores, const Tensor& indices,
                              MoeScoreFunction f, int64_t sequences,
                              float coeff, float grad_scale,
                              const MoeSequenceTotals& totals) {
  k::MoeBalanceArgs a;
  a.total_counts = totals.counts == nullptr
                       ? nullptr
                       : static_cast<const int64_t*>(totals.counts->raw_data());
  a.length = totals.length;
  a.tokens = scores.size(0);
  a.experts = scores.size(1);
  a.topk = indices.size(1);
  a.sequences = sequences;
  a.sigmoid = f == MoeScoreFunction::kSigmoid;
  a.coeff = coeff;
  a.grad_scale = grad_scale;
  return a;
}

// Device scratch from the caching allocator, returned once the call is
// queued: later work in this stream's order may reuse it safely.
Tensor Scratch(int64_t elements, DType dtype, const Device& device) {
  return Tensor::Empty({elements < 1 ? 1 : elements}, dtype, device);
}

}  // namespace

absl::Status MoeRouterForwardCuda(const Tensor& logits, const Tensor* bias,
                                  const MoeRouterOptions& options,
                                  Tensor* scores, Tensor* indices,
                                  Tensor* weights) {
  KernelScope s("MoeRouterForward", logits);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::MoeRouterForward(RouterArgs(logits, options), F32(logits),
                                     bias ? F32(*bias) : nullptr, F32(scores),
                                     I32(indices), F32(weights), s.stream()));
}

absl::Status MoeRouterBackwardCuda(const Tensor& scores, const Tensor& indices,
                                   const Tensor& dweights,
                                   const MoeRouterOptions& options,
                                   Tensor* dlogits) {
  KernelScope s("MoeRouterBackward", scores);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::MoeRouterBackward(RouterArgs(scores, options), F32(scores),
                                      I32(indices), F32(dweights), F32(dlogits),
                                      s.stream()));
}

absl::Status MoeLoadBalancingLossCuda(const Tensor& scores,
                                      const Tensor& indices, MoeScoreFunction f,
                                      int64_t sequences, float coeff,
                                      Tensor* loss,
                                      const MoeSequenceTotals& totals) {
  KernelScope s("MoeLoadBalancingLoss", scores);
  MCC_RETURN_IF_ERROR(s.status());
  const k::MoeBalanceArgs a =
      BalanceArgs(scores, indices, f, sequences, coeff, 1.0f, totals);
  const Device dev = scores.device();
  Tensor counts = Scratch(sequences * a.experts, DType::kInt64, dev);
  // float64 sums in 8-byte elements (no float64 dtype).
  Tensor psum = Scratch(sequences * a.experts, DType::kInt64, dev);
  Tensor z;
  if (a.sigmoid) z = Scratch(a.tokens, DType::kFloat32, dev);
  return s.Check(k::MoeLoadBalancingLoss(
      a, F32(scores), I32(indices), static_cast<int64_t*>(counts.raw_data()),
      static_cast<double*>(psum.raw_data()), a.sigmoid ? F32(&z) : nullptr,
      F32(loss), s.stream()));
}

absl::Status MoeLoadBalancingLossBackwardCuda(const Tensor& scores,
                                              const Tensor& indices,
                                              MoeScoreFunction f,
                                              int64_t sequences, float coeff,
                                              float grad_scale, Tensor* dlogits,
                                              const MoeSequenceTotals& totals) {
  KernelScope s("MoeLoadBalancingLossBackward", scores);
  MCC_RETURN_IF_ERROR(s.status());
  const k::MoeBalanceArgs a =
      BalanceArgs(scores, indices, f, sequences, coeff, grad_scale, totals);
  Tensor counts =
      Scratch(sequences * a.experts, DType::kInt64, scores.device());
  return s.Check(k::MoeLoadBalancingLossBackward(
      a, F32(scores), I32(indices), static_cast<int64_t*>(counts.raw_data()),
      F32(dlogits), s.stream()));
}

absl::Status MoeZLossCuda(const Tensor& logits, float coeff, Tensor* loss) {
  KernelScope s("MoeZLoss", logits);
  MCC_RETURN_IF_ERROR(s.status());
  Tensor terms = Scratch(logits.size(0), DType::kInt64, logits.device());
  return s.Check(k::MoeZLoss(F32(logits), logits.size(0), logits.size(1), coeff,
                             static_cast<double*>(terms.raw_data()), F32(loss),
                             s.stream()));
}

absl::Status MoeZLossBackwardCuda(const Tensor& logits, float coeff,
                                  float grad_scale, Tensor* dlogits) {
  KernelScope s("MoeZLossBackward", logits);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::MoeZLossBackward(F32(logits), logits.size(0),
                                     logits.size(1), coeff, grad_scale,
                                     F32(dlogits), s.stream()));
}

absl::Status MoeUpdateExpertBiasCuda(const Tensor& tokens_per_expert,
                                     float rate, Tensor* expert_bias) {
  KernelScope s("MoeUpdateExpertBias", tokens_per_expert);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::MoeUpdateExpertBias(
      static_cast<const int64_t*>(tokens_per_expert.raw_data()),
      tokens_per_expert.numel(), rate, F32(expert_bias), s.stream()));
}

absl::Status MoeSortTokensCuda(const Tensor& indices, int64_t num_experts,
                               Tensor* row_to_slot, Tensor* slot_to_row,
                               Tensor* tokens_per_expert) {
  KernelScope s("MoeSortTokens", indices);
  MCC_RETURN_IF_ERROR(s.status());
  if (num_experts > 2147483647) {
    return absl::InvalidArgumentError(
        "MoeSortTokens: the CUDA kernel takes at most 2^31 - 1 experts");
  }
  return s.Check(k::MoeSortTokens(
      I32(indices), indices.numel(), num_experts, I32(row_to_slot),
      I32(slot_to_row), static_cast<int64_t*>(tokens_per_expert->raw_data()),
      s.stream()));
}

absl::Status MoePermuteCuda(const Tensor& x, const Tensor& row_to_slot,
                            Tensor* permuted) {
  KernelScope s("MoePermute", x);
  MCC_RETURN_IF_ERROR(s.status());
  const int64_t tokens = x.size(0), rows = permuted->size(0);
  if (rows == 0) return absl::OkStatus();
  return s.Check(k::MoePermute(x.raw_data(), ElemTypeOf(x), I32(row_to_slot),
                               tokens, rows / tokens, x.size(1),
                               permuted->raw_data(), s.stream()));
}

absl::Status MoeUnpermuteCuda(const Tensor& expert_out,
                              const Tensor& slot_to_row, const Tensor* weights,
                              Tensor* y) {
  KernelScope s("MoeUnpermute", expert_out);
  MCC_RETURN_IF_ERROR(s.status());
  const int64_t tokens = y->size(0);
  if (tokens == 0) return absl::OkStatus();
  return s.Check(k::MoeUnpermute(
      expert_out.raw_data(), ElemTypeOf(expert_out), I32(slot_to_row),
      weights ? F32(*weights) : nullptr, tokens, expert_out.size(0) / tokens,
      expert_out.size(1), y->raw_data(), s.stream()));
}

absl::Status MoeUnpermuteBackwardCuda(const Tensor& dy,
                                      const Tensor& expert_out,
                                      const Tensor& slot_to_row,
                                      const Tensor* weights,
                                      Tensor* dexpert_out, Tensor* dweights) {
  KernelScope s("MoeUnpermuteBackward", dy);
  MCC_RETURN_IF_ERROR(s.status());
  const int64_t tokens = dy.size(0);
  if (tokens == 0) return absl::OkStatus();
  return s.Check(k::MoeUnpermuteBackward(
      dy.raw_data(), expert_out.raw_data(), ElemTypeOf(dy), I32(slot_to_row),
      weights ? F32(*weights) : nullptr, tokens, expert_out.size(0) / tokens,
      dy.size(1), dexpert_out->raw_data(), dweights ? F32(dweights) : nullptr,
      s.stream()));
}

}  // namespace cuda
}  // namespace ops
}  // namespace mcc
