#include "core/ops/cuda/registrations.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/ops/abs_max.h"
#include "core/ops/activation.h"
#include "core/ops/adamw.h"
#include "core/ops/attention.h"
#include "core/ops/bias.h"
#include "core/ops/cached_attention.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/cuda/cached_attention.h"
#include "core/ops/cuda/dropout.h"
#include "core/ops/cuda/elementwise.h"
#include "core/ops/cuda/embedding.h"
#include "core/ops/cuda/flash_attention.h"
#include "core/ops/cuda/flash_attention_options.h"
#include "core/ops/cuda/fp8.h"
#include "core/ops/cuda/fp8_lt_gemm.h"
#include "core/ops/cuda/fp8_weight.h"
#include "core/ops/cuda/gemm.h"
#include "core/ops/cuda/grouped_gemm.h"
#include "core/ops/cuda/index_check.h"
#include "core/ops/cuda/int8_gemm.h"
#include "core/ops/cuda/int8_quantize.h"
#include "core/ops/cuda/launch.h"
#include "core/ops/cuda/layout.h"
#include "core/ops/cuda/loss.h"
#include "core/ops/cuda/loss_totals.h"
#include "core/ops/cuda/moe_ops.h"
#include "core/ops/cuda/norm_loss.h"
#include "core/ops/cuda/paged_attention.h"
#include "core/ops/cuda/reduce.h"
#include "core/ops/cuda/rotary.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/fp8_gemm.h"
#include "core/ops/fp8_weight.h"
#include "core/ops/gemm.h"
#include "core/ops/grouped_gemm.h"
#include "core/ops/index_check.h"
#include "core/ops/int8_gemm.h"
#include "core/ops/int8_quantize.h"
#include "core/ops/layout.h"
#include "core/ops/loss_sum.h"
#include "core/ops/loss_totals.h"
#include "core/ops/moe_permute.h"
#include "core/ops/moe_router.h"
#include "core/ops/multi_tensor.h"
#include "core/ops/norm.h"
#include "core/ops/paged_attention.h"
#include "core/ops/reduce.h"
#include "core/ops/rotary.h"
#include "core/ops/sgd.h"
#include "core/status_macros.h"
#include "core/tensor_kernels.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

namespace k = ::mcc::cuda_kernels;

// Rows and columns of x viewed as [rows, last dimension].
void RowsCols(const Tensor& x, int64_t* rows, int64_t* cols) {
  *cols = x.dim() == 0 ? 1 : x.size(-1);
  *rows = *cols == 0 ? 0 : x.numel() / *cols;
}

const void* In(const Tensor& t) { return t.raw_data(); }
void* Out(const Tensor* t) { return t == nullptr ? nullptr : t->raw_data(); }
float* F32(const Tensor* t) {
  return t == nullptr ? nullptr : static_cast<float*>(t->raw_data());
}

// ---- Activations, bias ----------------------------------------------------

absl::Status GeluCuda(const Tensor& x, Tensor* y) {
  KernelScope s("Gelu", x);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::Gelu(In(x), ElemTypeOf(x), Out(y), ElemTypeOf(*y),
                         x.numel(), s.stream()));
}

absl::Status GeluBackwardCuda(const Tensor& dy, const Tensor& x, Tensor* dx) {
  KernelScope s("GeluBackward", x);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::GeluBackward(In(dy), ElemTypeOf(dy), In(x), ElemTypeOf(x),
                                 Out(dx), ElemTypeOf(*dx), x.numel(),
                                 s.stream()));
}

absl::Status BiasGeluCuda(const Tensor& x, const Tensor& bias, Tensor* y) {
  KernelScope s("BiasGelu", x);
  MCC_RETURN_IF_ERROR(s.status());
  int64_t rows, cols;
  RowsCols(x, &rows, &cols);
  return s.Check(k::BiasGelu(In(x), ElemTypeOf(x), In(bias), ElemTypeOf(bias),
                             Out(y), ElemTypeOf(*y), rows, cols, s.stream()));
}

absl::Status BiasGeluBackwardCuda(const Tensor& dy, const Tensor& x,
                                  const Tensor& bias, Tensor* dx,
                                  Tensor* dbias) {
  KernelScope s("BiasGeluBackward", x);
  MCC_RETURN_IF_ERROR(s.status());
  int64_t rows, cols;
  RowsCols(x, &rows, &cols);
  return s.Check(k::BiasGeluBackward(
      In(dy), ElemTypeOf(dy), In(x), ElemTypeOf(x), In(bias), ElemTypeOf(bias),
      Out(dx), ElemTypeOf(*dx), F32(dbias), rows, cols, s.stream()));
}

absl::Status SwiGLUCuda(const Tensor& x, Tensor* y) {
  KernelScope s("SwiGLU", x);
  MCC_RETURN_IF_ERROR(s.status());
  int64_t rows, h;
  RowsCols(*y, &rows, &h);
  return s.Check(k::SwiGLU(In(x), ElemTypeOf(x), Out(y), ElemTypeOf(*y), rows,
                           h, s.stream()));
}

absl::Status SwiGLUBackwardCuda(const Tensor& dy, const Tensor& x, Tensor* dx) {
  KernelScope s("SwiGLUBackward", x);
  MCC_RETURN_IF_ERROR(s.status());
  int64_t rows, h;
  RowsCols(dy, &rows, &h);
  return s.Check(k::SwiGLUBackward(In(dy), ElemTypeOf(dy), In(x), ElemTypeOf(x),
                                   Out(dx), ElemTypeOf(*dx), rows, h,
                                   s.stream()));
}

absl::Status BiasAddCuda(const Tensor& x, const Tensor& bias, Tensor* y) {
  KernelScope s("BiasAdd", x);
  MCC_RETURN_IF_ERROR(s.status());
  int64_t rows, cols;
  RowsCols(x, &rows, &cols);
  return s.Check(k::BiasAdd(In(x), ElemTypeOf(x), In(bias), ElemTypeOf(bias),
                            Out(y), ElemTypeOf(*y), rows, cols, s.stream()));
}

absl::Status BiasAddBackwardCuda(const Tensor& dy, Tensor* dbias) {
  KernelScope s("BiasAddBackward", dy);
  MCC_RETURN_IF_ERROR(s.status());
  int64_t rows, cols;
  RowsCols(dy, &rows, &cols);
  return s.Check(k::BiasGradAccumulate(In(dy), ElemTypeOf(dy), F32(dbias), rows,
                                       cols, s.stream()));
}

// ---- Optimizer -------------------------------------------------------------

absl::Status AdamWCuda(const AdamWConfig& cfg, const Tensor& grad,
                       Tensor* param, Tensor* exp_avg, Tensor* exp_avg_sq,
                       Tensor* param16) {
  KernelScope s("AdamWStep", *param);
  MCC_RETURN_IF_ERROR(s.status());
  // The scalars exactly as the CPU kernel (core/ops/adamw.cc) computes them.
  const double bc1 = 1.0 - std::pow(static_cast<double>(cfg.beta1), cfg.step);
  const double bc2 = 1.0 - std::pow(static_cast<double>(cfg.beta2), cfg.step);
  k::AdamWScalars sc;
  sc.step_size = static_cast<float>(cfg.lr / bc1);
  sc.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  sc.decay = 1.0f - cfg.lr * cfg.weight_decay;
  sc.beta1 = cfg.beta1;
  sc.beta2 = cfg.beta2;
  sc.eps = cfg.eps;
  sc.grad_scale = cfg.grad_scale;
  return s.Check(k::AdamWStep(
      sc, In(grad), ElemTypeOf(grad), F32(param), F32(exp_avg), F32(exp_avg_sq),
      Out(param16), param16 ? ElemTypeOf(*param16) : k::ElemType::kBF16,
      param->numel(), s.stream()));
}

absl::Status SgdCuda(const SgdConfig& cfg, const Tensor& grad, Tensor* param,
                     Tensor* momentum_buffer) {
  KernelScope s("SgdStep", *param);
  MCC_RETURN_IF_ERROR(s.status());
  k::SgdScalars sc;
  sc.lr = cfg.lr;
  sc.momentum = cfg.momentum;
  sc.weight_decay = cfg.weight_decay;
  sc.grad_scale = cfg.grad_scale;
  sc.nesterov = cfg.nesterov;
  sc.first_step = cfg.first_step;
  return s.Check(k::SgdStep(sc, In(grad), ElemTypeOf(grad), F32(param),
                            F32(momentum_buffer), param->numel(), s.stream()));
}

// ---- Embedding -------------------------------------------------------------

absl::Status EmbeddingLookupCuda(const Tensor& ids, const Tensor& table,
                                 Tensor* out, const EmbeddingShard& shard) {
  KernelScope s("EmbeddingLookup", table);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::EmbeddingLookup(
      In(ids), ElemTypeOf(ids), ids.numel(), In(table), ElemTypeOf(table),
      table.size(0), table.size(1), shard.vocab_start, shard.mask_outside,
      Out(out), ElemTypeOf(*out), s.stream()));
}

absl::Status EmbeddingBackwardCuda(const Tensor& ids, const Tensor& dout,
                                   Tensor* dtable,
                                   const EmbeddingShard& shard) {
  KernelScope s("EmbeddingBackward", *dtable);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(
      k::EmbeddingBackward(In(ids), ElemTypeOf(ids), ids.numel(), In(dout),
                           ElemTypeOf(dout), dtable->size(0), dtable->size(1),
                           shard.vocab_start, F32(dtable), s.stream()));
}

// ---- Tensor primitives and elementwise ops --------------------------------

// The bit pattern of value in x's dtype, converted as the CPU's FillCpu
// converts it (core/tensor.cc).
uint64_t FillPattern(double value, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: {
      const float f = static_cast<float>(value);
      uint32_t bits;
      std::memcpy(&bits, &f, sizeof(bits));
      return bits;
    }
    case DType::kBFloat16:
      return FloatToBFloat16(static_cast<float>(value)).bits;
    case DType::kFloat16:
      return FloatToFloat16(static_cast<float>(value)).bits;
    case DType::kInt32:
      return static_cast<uint32_t>(static_cast<int32_t>(value));
    case DType::kInt64:
      return static_cast<uint64_t>(static_cast<int64_t>(value));
    case DType::kInt8:
      return static_cast<uint8_t>(static_cast<int8_t>(value));
  }
  return 0;
}

absl::Status FillCuda(double value, Tensor* x) {
  KernelScope s("Fill", *x);
  MCC_RETURN_IF_ERROR(s.status());
  if (x->numel() == 0) return absl::OkStatus();
  if (value == 0.0 && !std::signbit(value)) {
    // +0 is all zero bits in every dtype.
    return s.Check(cudaMemsetAsync(x->raw_data(), 0, x->nbytes(), s.stream()));
  }
  return s.Check(
      k::FillBits(x->raw_data(), static_cast<int>(DTypeSize(x->dtype())),
                  FillPattern(value, x->dtype()), x->numel(), s.stream()));
}

absl::Status ConvertCuda(const Tensor& src, Tensor* dst) {
  KernelScope s("Convert", src);
  MCC_RETURN_IF_ERROR(s.status());
  if (src.numel() == 0) return absl::OkStatus();
  if (src.dtype() == dst->dtype()) {
    if (src.raw_data() == dst->raw_data()) return absl::OkStatus();
    return s.Check(cudaMemcpyAsync(dst->raw_data(), src.raw_data(),
                                   src.nbytes(), cudaMemcpyDeviceToDevice,
                                   s.stream()));
  }
  return s.Check(k::Convert(In(src), ElemTypeOf(src), Out(dst),
                            ElemTypeOf(*dst), src.numel(), s.stream()));
}

absl::Status ScaleCuda(const Tensor& x, float alpha, Tensor* y) {
  KernelScope s("Scale", x);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::Scale(In(x), ElemTypeOf(x), alpha, Out(y), ElemTypeOf(*y),
                          x.numel(), s.stream()));
}

absl::Status AddCuda(const Tensor& a, const Tensor& b, Tensor* y) {
  KernelScope s("Add", a);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::Add(In(a), ElemTypeOf(a), In(b), ElemTypeOf(b), Out(y),
                        ElemTypeOf(*y), a.numel(), s.stream()));
}

absl::Status AccumulateCuda(const Tensor& x, float alpha, Tensor* y) {
  KernelScope s("Accumulate", x);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::Accumulate(In(x), ElemTypeOf(x), alpha, Out(y),
                               ElemTypeOf(*y), x.numel(), s.stream()));
}

// ---- Norms -----------------------------------------------------------------

absl::Status NormForwardCuda(const char* op, const Tensor& x,
                             const Tensor& gamma, const Tensor* beta, float eps,
                             Tensor* y, Tensor* mean, Tensor* rstd) {
  KernelScope s(op, x);
  MCC_RETURN_IF_ERROR(s.status());
  int64_t rows, cols;
  RowsCols(x, &rows, &cols);
  return s.Check(k::NormForward(In(x), ElemTypeOf(x), In(gamma),
                                beta ? In(*beta) : nullptr, ElemTypeOf(gamma),
                                Out(y), ElemTypeOf(*y), F32(mean), F32(rstd),
                                rows, cols, eps, s.stream()));
}

absl::Status NormBackwardCuda(const char* op, const Tensor& dy, const Tensor& x,
                              const Tensor& gamma, const Tensor* mean,
                              const Tensor& rstd, Tensor* dx, Tensor* dgamma,
                              Tensor* dbeta) {
  KernelScope s(op, x);
  MCC_RETURN_IF_ERROR(s.status());
  int64_t rows, cols;
  RowsCols(x, &rows, &cols);
  return s.Check(k::NormBackward(
      In(dy), ElemTypeOf(dy), In(x), ElemTypeOf(x), In(gamma),
      ElemTypeOf(gamma), mean ? F32(mean) : nullptr, F32(&rstd), Out(dx),
      ElemTypeOf(*dx), F32(dgamma), F32(dbeta), rows, cols, s.stream()));
}

absl::Status LayerNormForwardCuda(const Tensor& x, const Tensor& gamma,
                                  const Tensor& beta, float eps, Tensor* y,
                                  Tensor* mean, Tensor* rstd) {
  return NormForwardCuda("LayerNormForward", x, gamma, &beta, eps, y, mean,
                         rstd);
}

absl::Status LayerNormBackwardCuda(const Tensor& dy, const Tensor& x,
                                   const Tensor& gamma, const Tensor& mean,
                                   const Tensor& rstd, Tensor* dx,
                                   Tensor* dgamma, Tensor* dbeta) {
  return NormBackwardCuda("LayerNormBackward", dy, x, gamma, &mean, rstd, dx,
                          dgamma, dbeta);
}

absl::Status RMSNormForwardCuda(const Tensor& x, const Tensor& gamma, float eps,
                                Tensor* y, Tensor* rstd) {
  return NormForwardCuda("RMSNormForward", x, gamma, nullptr, eps, y, nullptr,
                         rstd);
}

absl::Status RMSNormBackwardCuda(const Tensor& dy, const Tensor& x,
                                 const Tensor& gamma, const Tensor& rstd,
                                 Tensor* dx, Tensor* dgamma) {
  return NormBackwardCuda("RMSNormBackward", dy, x, gamma, nullptr, rstd, dx,
                          dgamma, nullptr);
}

// ---- Cross entropy ---------------------------------------------------------

absl::Status CrossEntropyForwardCuda(const Tensor& logits,
                                     const Tensor& targets, Tensor* loss,
                                     Tensor* lse, int64_t ignore_index) {
  KernelScope s("CrossEntropyForward", logits);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::CrossEntropyForward(
      In(logits), ElemTypeOf(logits), In(targets), ElemTypeOf(targets),
      F32(loss), F32(lse), logits.size(0), logits.size(1), ignore_index,
      s.stream()));
}

absl::Status CrossEntropyBackwardCuda(const Tensor& logits,
                                      const Tensor& targets, const Tensor& lse,
                                      const Tensor& dloss, Tensor* dlogits,
                                      int64_t ignore_index) {
  KernelScope s("CrossEntropyBackward", logits);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::CrossEntropyBackward(
      In(logits), ElemTypeOf(logits), In(targets), ElemTypeOf(targets),
      F32(&lse), F32(&dloss), Out(dlogits), ElemTypeOf(*dlogits),
      logits.size(0), logits.size(1), ignore_index, s.stream()));
}

// ---- Loss sum --------------------------------------------------------------

absl::Status LossSumCuda(const Tensor& loss, const Tensor& mask,
                         const Tensor& labels, int64_t ignore_index,
                         bool accumulate, Tensor* out) {
  KernelScope s("LossSum", *out);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::LossSum(F32(&loss), mask.defined() ? F32(&mask) : nullptr,
                            In(labels), ElemTypeOf(labels), loss.numel(),
                            ignore_index, accumulate, F32(out), s.stream()));
}

absl::Status LossSumGradientCuda(const Tensor& loss_sum, const Tensor& mask,
                                 float grad_scale, Tensor* dloss) {
  KernelScope s("LossSumGradient", loss_sum);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(
      k::LossSumGradient(F32(&loss_sum), mask.defined() ? F32(&mask) : nullptr,
                         grad_scale, F32(dloss), dloss->numel(), s.stream()));
}

// ---- Index checks, loss totals, int8 ---------------------------------------

// The device's answer to "is there an offending element, and which" (a key
// the kernel wrote, ~0 for none), read on the host: the error must be
// returned from the call, so these ops synchronise with the host once each
// (CheckIndexRange runs once per micro-batch on its ids; the int8 ones run
// at load).
absl::StatusOr<unsigned long long> ReadKey(const KernelScope& s,
                                           const unsigned long long* key) {
  unsigned long long value = 0;
  MCC_RETURN_IF_ERROR(s.Check(cudaMemcpyAsync(
      &value, key, sizeof(value), cudaMemcpyDeviceToHost, s.stream())));
  MCC_RETURN_IF_ERROR(s.Check(cudaStreamSynchronize(s.stream())));
  return value;
}

constexpr unsigned long long kNoKey = ~0ull;

unsigned long long* KeyOf(Tensor* scratch) {
  return static_cast<unsigned long long*>(scratch->raw_data());
}

absl::Status CheckIndexRangeCuda(const Tensor& ids, int64_t limit,
                                 int64_t ignore_index, absl::string_view what) {
  KernelScope s("CheckIndexRange", ids);
  MCC_RETURN_IF_ERROR(s.status());
  Tensor scratch = Tensor::Empty({1}, DType::kInt64, ids.device());
  MCC_RETURN_IF_ERROR(
      s.Check(k::FirstOutOfRange(In(ids), ElemTypeOf(ids), ids.numel(), limit,
                                 ignore_index, KeyOf(&scratch), s.stream())));
  MCC_ASSIGN_OR_RETURN(const unsigned long long first,
                       ReadKey(s, KeyOf(&scratch)));
  if (first == kNoKey) return absl::OkStatus();
  // The offending id itself, for the CPU kernel's message.
  const int64_t i = static_cast<int64_t>(first);
  int64_t id = 0;
  if (ids.dtype() == DType::kInt32) {
    int32_t v = 0;
    MCC_RETURN_IF_ERROR(s.Check(cudaMemcpy(&v, ids.data<int32_t>() + i,
                                           sizeof(v), cudaMemcpyDeviceToHost)));
    id = v;
  } else {
    MCC_RETURN_IF_ERROR(s.Check(cudaMemcpy(
        &id, ids.data<int64_t>() + i, sizeof(id), cudaMemcpyDeviceToHost)));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, " ", id, " at token ", i, " is outside the vocabulary of ", limit));
}

absl::Status AccumulateLossTotalsCuda(const Tensor& loss_sum,
                                      int num_microbatches, Tensor* totals) {
  KernelScope s("AccumulateLossTotals", *totals);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::AccumulateLossTotals(F32(&loss_sum), num_microbatches,
                                         F32(totals), s.stream()));
}

absl::Status PackLossTotalsCuda(const Tensor& totals, Tensor* packed) {
  KernelScope s("PackLossTotals", *packed);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::PackLossTotals(F32(&totals), F32(packed), s.stream()));
}

absl::Status RowAbsMaxCuda(const Tensor& w, Tensor* absmax) {
  KernelScope s("RowAbsMax", w);
  MCC_RETURN_IF_ERROR(s.status());
  const int64_t rows = w.size(0), cols = w.size(1);
  Tensor scratch = Tensor::Empty({1}, DType::kInt64, w.device());
  MCC_RETURN_IF_ERROR(
      s.Check(k::RowAbsMax(In(w), ElemTypeOf(w), rows, cols, F32(absmax),
                           KeyOf(&scratch), s.stream())));
  MCC_ASSIGN_OR_RETURN(const unsigned long long key,
                       ReadKey(s, KeyOf(&scratch)));
  if (key == kNoKey) return absl::OkStatus();
  int64_t r, c;
  k::DecodeBadKey(key, cols, &r, &c);
  return absl::InvalidArgumentError(absl::StrCat(
      "RowAbsMax: w ", w.Describe(), " has a non-finite value at row ", r,
      " column ", c, "; it cannot be quantised"));
}

absl::Status QuantizeRowsInt8Cuda(const Tensor& w, const Tensor& absmax,
                                  Tensor* q, Tensor* scales) {
  KernelScope s("QuantizeRowsInt8", w);
  MCC_RETURN_IF_ERROR(s.status());
  const int64_t rows = w.size(0), cols = w.size(1);
  Tensor scratch = Tensor::Empty({1}, DType::kInt64, w.device());
  MCC_RETURN_IF_ERROR(s.Check(k::QuantizeRowsInt8(
      In(w), ElemTypeOf(w), F32(&absmax), rows, cols, q->data<int8_t>(),
      F32(scales), KeyOf(&scratch), s.stream())));
  MCC_ASSIGN_OR_RETURN(const unsigned long long key,
                       ReadKey(s, KeyOf(&scratch)));
  if (key == kNoKey) return absl::OkStatus();
  int64_t r, c;
  k::DecodeBadKey(key, cols, &r, &c);
  float m = 0.0f;  // The row maximum given, for the CPU kernel's message.
  MCC_RETURN_IF_ERROR(s.Check(cudaMemcpy(&m, absmax.data<float>() + r,
                                         sizeof(m), cudaMemcpyDeviceToHost)));
  return absl::InvalidArgumentError(absl::StrCat(
      "QuantizeRowsInt8: w ", w.Describe(), " row ", r, " column ", c,
      " exceeds the row maximum given (", m, ") or is not finite"));
}

absl::Status Int8GemmCuda(const Tensor& x, const Tensor& q,
                          const Tensor& scales, Tensor* y) {
  KernelScope s("Int8Gemm", x);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::Int8Gemm(In(x), ElemTypeOf(x), q.data<int8_t>(),
                             F32(&scales), Out(y), ElemTypeOf(*y), x.size(0),
                             q.size(0), x.size(1), s.stream()));
}

// ---- FP8 (core/ops/abs_max.h, core/ops/fp8_gemm.h) --------------------------

absl::Status AbsMaxCuda(const Tensor& x, Tensor* amax) {
  KernelScope s("AbsMax", x);
  MCC_RETURN_IF_ERROR(s.status());
  Tensor partial =
      Tensor::Empty({k::AbsMaxBlocks(x.numel())}, DType::kInt32, x.device());
  return s.Check(k::AbsMax(In(x), ElemTypeOf(x), x.numel(),
                           static_cast<uint32_t*>(partial.raw_data()),
                           F32(amax), s.stream()));
}

// cuBLASLt's native FP8 matmul where the device and the case allow it
// (fp8_lt_gemm.h: sm_89+, K and N multiples of 16, not E5M2 x E5M2).
// Otherwise the operands cast to their FP8 values held in bf16 (exact:
// FP8's 2 or 3 mantissa bits and exponent range fit bf16's), multiplied by
// cuBLAS in fp32 (every product of two FP8 values is exact in fp32), then
// scaled back once: the contract's numbers with bf16 tensor cores.
absl::Status Fp8GemmCuda(const Tensor& a, bool trans_a, Fp8Format a_format,
                         const Tensor& a_scale, const Tensor& b, bool trans_b,
                         Fp8Format b_format, const Tensor& b_scale, Tensor* c,
                         float alpha, float beta) {
  const absl::Status native =
      Fp8GemmCublasLt(a, trans_a, a_format, a_scale, b, trans_b, b_format,
                      b_scale, c, alpha, beta);
  if (!absl::IsUnimplemented(native)) return native;  // Ran, or failed.
  KernelScope s("Fp8Gemm", a);
  MCC_RETURN_IF_ERROR(s.status());
  Tensor a8 = Tensor::Empty(a.shape(), DType::kBFloat16, a.device());
  Tensor b8 = Tensor::Empty(b.shape(), DType::kBFloat16, b.device());
  MCC_RETURN_IF_ERROR(s.Check(k::CastToFp8Values(
      In(a), ElemTypeOf(a), F32(&a_scale), a_format == Fp8Format::kE5M2,
      Out(&a8), k::ElemType::kBF16, a.numel(), s.stream())));
  MCC_RETURN_IF_ERROR(s.Check(k::CastToFp8Values(
      In(b), ElemTypeOf(b), F32(&b_scale), b_format == Fp8Format::kE5M2,
      Out(&b8), k::ElemType::kBF16, b.numel(), s.stream())));
  Tensor sum = Tensor::Empty(c->shape(), DType::kFloat32, c->device());
  MCC_RETURN_IF_ERROR(Gemm(a8, trans_a, b8, trans_b, &sum, 1.0f, 0.0f));
  return s.Check(k::Fp8Dequantize(F32(&sum), F32(&a_scale), F32(&b_scale),
                                  alpha, beta, Out(c), ElemTypeOf(*c),
                                  c->numel(), s.stream()));
}

// ---- Weight-only FP8 (core/ops/fp8_weight.h) -------------------------------

// The rows are checked first (one host synchronisation, at load), so a
// failed call writes nothing, as the CPU kernel.
absl::Status QuantizeWeightFp8Cuda(const Tensor& w, const Tensor& absmax,
                                   Tensor* codes, Tensor* scales) {
  KernelScope s("QuantizeWeightFp8", w);
  MCC_RETURN_IF_ERROR(s.status());
  const int64_t rows = w.size(0), cols = w.size(1);
  Tensor scratch = Tensor::Empty({1}, DType::kInt64, w.device());
  MCC_RETURN_IF_ERROR(
      s.Check(k::CheckFp8WeightRows(In(w), ElemTypeOf(w), F32(&absmax), rows,
                                    cols, KeyOf(&scratch), s.stream())));
  MCC_ASSIGN_OR_RETURN(const unsigned long long key,
                       ReadKey(s, KeyOf(&scratch)));
  if (key != kNoKey) {
    const int64_t r = static_cast<int64_t>(key) / cols;
    const int64_t c = static_cast<int64_t>(key) % cols;
    // The two values, for the CPU kernel's message.
    MCC_ASSIGN_OR_RETURN(Tensor row, w.Slice(r, r + 1));
    MCC_ASSIGN_OR_RETURN(row, row.Reshape({cols}));
    MCC_ASSIGN_OR_RETURN(Tensor element, row.Slice(c, c + 1));
    MCC_ASSIGN_OR_RETURN(element, element.To(Device::CPU()));
    MCC_ASSIGN_OR_RETURN(Tensor limit, absmax.Slice(r, r + 1));
    MCC_ASSIGN_OR_RETURN(limit, limit.To(Device::CPU()));
    return absl::InvalidArgumentError(
        absl::StrCat("QuantizeWeightFp8: absmax[", r,
                     "] = ", limit.ToFloats()[0], " is below |w[", r, ", ", c,
                     "]| = ", std::fabs(element.ToFloats()[0])));
  }
  return s.Check(k::QuantizeWeightFp8(In(w), ElemTypeOf(w), F32(&absmax), rows,
                                      cols, codes->data<int8_t>(), F32(scales),
                                      s.stream()));
}

absl::Status Fp8WeightGemmCuda(const Tensor& x, const Tensor& codes,
                               const Tensor& scales, Tensor* y) {
  KernelScope s("Fp8WeightGemm", x);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::Fp8WeightGemm(
      In(x), ElemTypeOf(x), codes.data<int8_t>(), F32(&scales), Out(y),
      ElemTypeOf(*y), x.size(0), codes.size(0), x.size(1), s.stream()));
}

// ---- Reductions ------------------------------------------------------------

// Float64 scratch on the device for a call's reductions (int64 storage: the
// tensor dtypes have no float64), returned to the caching allocator when
// the call ends; later work in this stream's order may reuse it safely.
double* Words(Tensor* scratch) { return static_cast<double*>(Out(scratch)); }

absl::StatusOr<double> ReduceCuda(const Tensor& x, bool square) {
  KernelScope s(square ? "SumOfSquares" : "Sum", x);
  MCC_RETURN_IF_ERROR(s.status());
  Tensor scratch = Tensor::Empty({k::OrderedSumScratch(x.numel()) + 1},
                                 DType::kInt64, x.device());
  double* result = Words(&scratch);
  MCC_RETURN_IF_ERROR(
      s.Check(k::OrderedSum(In(x), ElemTypeOf(x), x.numel(), square, result + 1,
                            result, s.stream())));
  // The op returns a host value: this is its one synchronisation.
  double value = 0.0;
  MCC_RETURN_IF_ERROR(s.Check(cudaMemcpyAsync(
      &value, result, sizeof(value), cudaMemcpyDeviceToHost, s.stream())));
  MCC_RETURN_IF_ERROR(s.Check(cudaStreamSynchronize(s.stream())));
  return value;
}

absl::Status MultiTensorSumOfSquaresCuda(absl::Span<const Tensor> counted,
                                         absl::Span<const Tensor> checked,
                                         const SumOfSquaresOptions& options,
                                         Tensor* out) {
  KernelScope s("MultiTensorSumOfSquares", *out);
  MCC_RETURN_IF_ERROR(s.status());
  const int64_t tensors = static_cast<int64_t>(counted.size() + checked.size());
  // Layout: per-tensor sums, zero counts, then each tensor's scratch.
  int64_t words = 2 * tensors;
  for (const Tensor& t : counted) words += k::OrderedSumScratch(t.numel());
  for (const Tensor& t : checked) words += k::OrderedSumScratch(t.numel());
  Tensor scratch = Tensor::Empty({std::max<int64_t>(words, 1)}, DType::kInt64,
                                 out->device());
  double* sums = Words(&scratch);
  auto* zeros = reinterpret_cast<unsigned long long*>(sums + tensors);
  double* next = sums + 2 * tensors;
  if (options.count_zeros && !counted.empty()) {
    MCC_RETURN_IF_ERROR(s.Check(cudaMemsetAsync(
        zeros, 0, counted.size() * sizeof(unsigned long long), s.stream())));
  }
  int64_t i = 0;
  for (absl::Span<const Tensor> list : {counted, checked}) {
    for (const Tensor& t : list) {
      MCC_RETURN_IF_ERROR(
          s.Check(k::OrderedSum(In(t), ElemTypeOf(t), t.numel(),
                                /*square=*/true, next, sums + i, s.stream())));
      if (options.count_zeros && i < static_cast<int64_t>(counted.size())) {
        MCC_RETURN_IF_ERROR(s.Check(k::CountZeros(
            In(t), ElemTypeOf(t), t.numel(), zeros + i, s.stream())));
      }
      next += k::OrderedSumScratch(t.numel());
      ++i;
    }
  }
  return s.Check(k::FinishSumOfSquares(
      sums, options.count_zeros ? zeros : nullptr,
      static_cast<int>(counted.size()), static_cast<int>(checked.size()),
      options.scale, F32(out), s.stream()));
}

// ---- Layout --------------------------------------------------------------

// The plan with size-1 dimensions dropped and nested dimensions that are
// contiguous on both sides merged (fewer index divisions per element).
k::CopyPlan Simplified(const StridedCopyPlan& p) {
  k::CopyPlan q;
  q.src_offset = p.src_offset;
  q.dst_offset = p.dst_offset;
  for (int d = 0; d < p.rank; ++d) {
    if (p.shape[d] == 1) continue;
    if (q.rank > 0) {
      const int j = q.rank - 1;
      if (q.src_strides[j] == p.shape[d] * p.src_strides[d] &&
          q.dst_strides[j] == p.shape[d] * p.dst_strides[d]) {
        q.shape[j] *= p.shape[d];
        q.src_strides[j] = p.src_strides[d];
        q.dst_strides[j] = p.dst_strides[d];
        continue;
      }
    }
    q.shape[q.rank] = p.shape[d];
    q.src_strides[q.rank] = p.src_strides[d];
    q.dst_strides[q.rank] = p.dst_strides[d];
    ++q.rank;
  }
  return q;
}

absl::Status StridedCopyCuda(const Tensor& src, const StridedCopyPlan& plan,
                             Tensor* dst) {
  static_assert(k::CopyPlan::kMaxDims == kMaxCopyDims, "plan sizes differ");
  KernelScope s("StridedCopy", src);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::StridedCopy(src.raw_data(), dst->raw_data(),
                                static_cast<int>(DTypeSize(src.dtype())),
                                Simplified(plan), s.stream()));
}

// ---- Dropout ---------------------------------------------------------------

absl::Status DropoutCuda(const Tensor& x, float p, uint64_t seed,
                         uint64_t offset, Tensor* y) {
  KernelScope s("Dropout", x);
  MCC_RETURN_IF_ERROR(s.status());
  // As the CPU kernel (core/ops/dropout.cc) computes them.
  const uint32_t threshold =
      static_cast<uint32_t>(std::lround(static_cast<double>(p) * (1 << 24)));
  const float scale = 1.0f / (1.0f - p);
  return s.Check(k::Dropout(In(x), ElemTypeOf(x), Out(y), ElemTypeOf(*y),
                            x.numel(), seed, offset, threshold, scale,
                            p == 0.0f, s.stream()));
}

// ---- Attention -------------------------------------------------------------

// The kernels' arguments for q and k (flash_attention_options.h).
k::FlashAttentionArgs AttentionArgsOf(const Tensor& q, const Tensor& kv,
                                      const AttentionOptions& o) {
  return FlashAttentionArgsOf(q.size(0), q.size(1), q.size(2), kv.size(2),
                              q.size(3), o);
}

// AttentionOptions::first_key (int32 [b, s]) in the device's memory, for
// the kernels to read; undefined without one. One already there is used as
// it is; a host one is copied, and the copy goes back to the caching
// allocator when the caller's scope ends (later work on the stream may
// reuse it safely).
absl::StatusOr<Tensor> FirstKeyOnDevice(const AttentionOptions& o,
                                        Device device) {
  if (!o.first_key.defined()) return Tensor();
  if (o.first_key.device() == device) return o.first_key;
  return o.first_key.To(device);
}

// The head dims the kernels take, and shared memory for their tiles.
absl::Status CheckAttentionFits(const KernelScope& s, const char* op,
                                const Tensor& q) {
  const int64_t d = q.size(3);
  if (d > k::FlashAttentionArgs::kMaxHeadDim) {
    return absl::UnimplementedError(absl::StrCat(
        op, ": the CUDA kernel takes head_dim up to ",
        k::FlashAttentionArgs::kMaxHeadDim, ", got q ", q.Describe()));
  }
  int optin = 0;
  MCC_RETURN_IF_ERROR(s.Check(cudaDeviceGetAttribute(
      &optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, s.device())));
  const size_t need = k::FlashAttentionSharedBytes(d);
  if (static_cast<size_t>(optin) < need) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": head_dim ", d, " needs ", need,
                     " bytes of shared memory per block; cuda:", s.device(),
                     " allows ", optin));
  }
  return absl::OkStatus();
}

absl::Status FlashAttentionForwardCuda(const Tensor& q, const Tensor& kt,
                                       const Tensor& v,
                                       const AttentionOptions& options,
                                       Tensor* out, Tensor* lse) {
  KernelScope s("FlashAttentionForward", q);
  MCC_RETURN_IF_ERROR(s.status());
  if (q.numel() == 0) return absl::OkStatus();
  MCC_RETURN_IF_ERROR(CheckAttentionFits(s, "FlashAttentionForward", q));
  MCC_ASSIGN_OR_RETURN(Tensor first_key, FirstKeyOnDevice(options, q.device()));
  k::FlashAttentionArgs args = AttentionArgsOf(q, kt, options);
  if (first_key.defined()) {
    args.first_key = static_cast<const int32_t*>(first_key.raw_data());
  }
  return s.Check(k::FlashAttentionForward(
      args, In(q), In(kt), In(v), ElemTypeOf(q), Out(out), ElemTypeOf(*out),
      F32(lse), s.stream()));
}

absl::Status FlashAttentionBackwardCuda(const Tensor& q, const Tensor& kt,
                                        const Tensor& v, const Tensor& out,
                                        const Tensor& dout, const Tensor& lse,
                                        const AttentionOptions& options,
                                        Tensor* dq, Tensor* dk, Tensor* dv) {
  KernelScope s("FlashAttentionBackward", q);
  MCC_RETURN_IF_ERROR(s.status());
  if (q.numel() == 0) return absl::OkStatus();
  MCC_RETURN_IF_ERROR(CheckAttentionFits(s, "FlashAttentionBackward", q));
  // D = rowsum(dout * out), [b, heads, s]; back to the caching allocator
  // when the call ends (later work on this stream may reuse it safely).
  Tensor row_dot = Tensor::Empty({q.size(0), q.size(2), q.size(1)},
                                 DType::kFloat32, q.device());
  MCC_ASSIGN_OR_RETURN(Tensor first_key, FirstKeyOnDevice(options, q.device()));
  k::FlashAttentionArgs args = AttentionArgsOf(q, kt, options);
  if (first_key.defined()) {
    args.first_key = static_cast<const int32_t*>(first_key.raw_data());
  }
  return s.Check(k::FlashAttentionBackward(
      args, In(q), In(kt), In(v), ElemTypeOf(q), In(out), In(dout),
      ElemTypeOf(out), F32(&lse), Out(dq), ElemTypeOf(*dq), Out(dk), Out(dv),
      ElemTypeOf(*dk), F32(&row_dot), s.stream()));
}

absl::Status CachedAttentionCuda(const Tensor& q, const Tensor& k_cache,
                                 const Tensor& v_cache, int64_t position,
                                 Tensor* out) {
  KernelScope s("CachedAttention", q);
  MCC_RETURN_IF_ERROR(s.status());
  const int64_t d = q.size(3);
  if (d > k::kCachedAttentionMaxHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat("CachedAttention: the CUDA kernel takes head_dim up to ",
                     k::kCachedAttentionMaxHeadDim, ", got q ", q.Describe()));
  }
  // The CPU kernel's scale (core/ops/cached_attention.cc).
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  return s.Check(k::CachedAttention(
      In(q), ElemTypeOf(q), F32(&k_cache), F32(&v_cache), Out(out), q.size(0),
      q.size(1), q.size(2), k_cache.size(2), k_cache.size(1), d, position,
      scale, s.stream()));
}

// ---- Paged decoding (the inference engine) -------------------------------

absl::Status PagedKvWriteCuda(const Tensor& k, const Tensor& v,
                              const Tensor& slots, Tensor* k_pool,
                              Tensor* v_pool) {
  KernelScope s("PagedKvWrite", k);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::PagedKvWrite(
      F32(&k), F32(&v), static_cast<const int64_t*>(In(slots)), F32(k_pool),
      F32(v_pool), k.size(0), k.size(1) * k.size(2), s.stream()));
}

absl::Status PagedAttentionCuda(const Tensor& q, const Tensor& k_pool,
                                const Tensor& v_pool,
                                const Tensor& block_tables,
                                const Tensor& positions, Tensor* out,
                                int64_t window_left) {
  KernelScope s("PagedAttention", q);
  MCC_RETURN_IF_ERROR(s.status());
  const int64_t d = q.size(2);
  if (d > k::kPagedAttentionMaxHeadDim) {
    return absl::UnimplementedError(
        absl::StrCat("PagedAttention: the CUDA kernel takes head_dim up to ",
                     k::kPagedAttentionMaxHeadDim, ", got q ", q.Describe()));
  }
  // The CPU kernel's scale (core/ops/paged_attention.cc).
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  return s.Check(
      k::PagedAttention(F32(&q), F32(&k_pool), F32(&v_pool),
                        static_cast<const int32_t*>(In(block_tables)),
                        static_cast<const int64_t*>(In(positions)), F32(out),
                        q.size(0), q.size(1), k_pool.size(2), d, k_pool.size(1),
                        block_tables.size(1), scale, window_left, s.stream()));
}

absl::Status RotaryAtPositionsCuda(const Tensor& x, const Tensor& positions,
                                   const RotaryOptions& options, Tensor* y) {
  KernelScope s("RotaryAtPositions", x);
  MCC_RETURN_IF_ERROR(s.status());
  k::RotaryArgs a;
  a.batch = x.size(0);
  a.seq = 1;
  a.heads = x.size(1);
  a.head_dim = x.size(2);
  a.rotary_dim = options.rotary_dim == 0 ? a.head_dim : options.rotary_dim;
  if (a.rotary_dim / 2 > k::RotaryArgs::kMaxHalf) {
    return absl::UnimplementedError(absl::StrCat(
        "RotaryAtPositions: the CUDA kernel takes rotary_dim up to ",
        2 * k::RotaryArgs::kMaxHalf, ", got ", a.rotary_dim, " for ",
        x.Describe()));
  }
  const std::vector<double> inv_freq =
      RotaryInverseFrequencies(options, a.rotary_dim);
  std::copy(inv_freq.begin(), inv_freq.end(), a.inv_freq);
  return s.Check(
      k::RotaryAtPositions(a, static_cast<const int64_t*>(In(positions)), In(x),
                           ElemTypeOf(x), Out(y), ElemTypeOf(*y), s.stream()));
}

// ---- Rotary ----------------------------------------------------------------

absl::Status RotaryCuda(const char* op, const Tensor& x,
                        const RotaryOptions& options, Tensor* y, float sign) {
  KernelScope s(op, x);
  MCC_RETURN_IF_ERROR(s.status());
  k::RotaryArgs a;
  a.batch = x.size(0);
  a.seq = x.size(1);
  a.heads = x.size(2);
  a.head_dim = x.size(3);
  a.rotary_dim = options.rotary_dim == 0 ? a.head_dim : options.rotary_dim;
  a.position_offset = options.position_offset;
  a.sign = sign;
  const int64_t half = a.rotary_dim / 2;
  if (half > k::RotaryArgs::kMaxHalf) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": the CUDA kernel takes rotary_dim up to ",
                     2 * k::RotaryArgs::kMaxHalf, ", got ", a.rotary_dim,
                     " for ", x.Describe()));
  }
  // As the CPU kernel's angle table (core/ops/rotary.cc) computes them.
  const std::vector<double> inv_freq =
      RotaryInverseFrequencies(options, a.rotary_dim);
  std::copy(inv_freq.begin(), inv_freq.end(), a.inv_freq);
  return s.Check(
      k::Rotary(a, In(x), ElemTypeOf(x), Out(y), ElemTypeOf(*y), s.stream()));
}

absl::Status RotaryForwardCuda(const Tensor& x, const RotaryOptions& options,
                               Tensor* y) {
  return RotaryCuda("RotaryForward", x, options, y, 1.0f);
}

absl::Status RotaryBackwardCuda(const Tensor& dy, const RotaryOptions& options,
                                Tensor* dx) {
  return RotaryCuda("RotaryBackward", dy, options, dx, -1.0f);
}

// The op returns host values and synchronises by contract: the per-token
// losses and targets come to the host (on the current stream, then waited
// for) and the CPU kernel sums them, so the bits are the CPU's.
absl::StatusOr<MeanLoss> CrossEntropyMeanLossCuda(const Tensor& loss,
                                                  const Tensor& targets,
                                                  int64_t ignore_index) {
  KernelScope s("CrossEntropyMeanLoss", loss);
  MCC_RETURN_IF_ERROR(s.status());
  Tensor host_loss = Tensor::Empty(loss.shape(), loss.dtype());
  Tensor host_targets = Tensor::Empty(targets.shape(), targets.dtype());
  MCC_RETURN_IF_ERROR(host_loss.CopyFrom(loss));
  MCC_RETURN_IF_ERROR(host_targets.CopyFrom(targets));
  MCC_RETURN_IF_ERROR(s.Check(cudaStreamSynchronize(s.stream())));
  MCC_ASSIGN_OR_RETURN(CrossEntropyMeanLossKernel cpu,
                       CrossEntropyMeanLossKernels().Get(Device::CPU()));
  return cpu(host_loss, host_targets, ignore_index);
}

// ---- Vocab-parallel cross entropy ----------------------------------------

absl::Status ShardedRowMaxCuda(const Tensor& logits, int64_t valid,
                               Tensor* row_max) {
  KernelScope s("ShardedCrossEntropyRowMax", logits);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::ShardedCrossEntropyRowMax(In(logits), ElemTypeOf(logits),
                                              logits.size(0), logits.size(1),
                                              valid, F32(row_max), s.stream()));
}

absl::Status ShardedSumsCuda(const Tensor& logits, const Tensor& targets,
                             const Tensor& row_max, int64_t vocab_start,
                             int64_t valid, Tensor* sums) {
  KernelScope s("ShardedCrossEntropySums", logits);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::ShardedCrossEntropySums(
      In(logits), ElemTypeOf(logits), In(targets), ElemTypeOf(targets),
      F32(&row_max), logits.size(0), logits.size(1), vocab_start, valid,
      F32(sums), s.stream()));
}

absl::Status ShardedLossCuda(const Tensor& sums, const Tensor& targets,
                             int64_t ignore_index, Tensor* loss) {
  KernelScope s("ShardedCrossEntropyLoss", targets);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::ShardedCrossEntropyLoss(
      F32(&sums), In(targets), ElemTypeOf(targets), targets.numel(),
      ignore_index, F32(loss), s.stream()));
}

absl::Status ShardedBackwardCuda(const Tensor& logits, const Tensor& targets,
                                 const Tensor& row_max, const Tensor& sums,
                                 const Tensor& dloss, int64_t vocab_start,
                                 int64_t valid, int64_t ignore_index,
                                 Tensor* dlogits) {
  KernelScope s("ShardedCrossEntropyBackward", logits);
  MCC_RETURN_IF_ERROR(s.status());
  return s.Check(k::ShardedCrossEntropyBackward(
      In(logits), ElemTypeOf(logits), In(targets), ElemTypeOf(targets),
      F32(&row_max), F32(&sums), F32(&dloss), logits.size(0), logits.size(1),
      vocab_start, valid, ignore_index, Out(dlogits), ElemTypeOf(*dlogits),
      s.stream()));
}

}  // namespace

bool RegisterCudaKernels() {
  static const bool registered = [] {
    constexpr DeviceType kCuda = DeviceType::kCUDA;
    // Index checks, loss totals and int8 (kept as one block).
    CheckIndexRangeKernels().Register(kCuda, &CheckIndexRangeCuda);
    AccumulateLossTotalsKernels().Register(kCuda, &AccumulateLossTotalsCuda);
    PackLossTotalsKernels().Register(kCuda, &PackLossTotalsCuda);
    RowAbsMaxKernels().Register(kCuda, &RowAbsMaxCuda);
    QuantizeRowsInt8Kernels().Register(kCuda, &QuantizeRowsInt8Cuda);
    Int8GemmKernels().Register(kCuda, &Int8GemmCuda);
    AbsMaxKernels().Register(kCuda, &AbsMaxCuda);
    Fp8GemmKernels().Register(kCuda, &Fp8GemmCuda);
    QuantizeWeightFp8Kernels().Register(kCuda, &QuantizeWeightFp8Cuda);
    Fp8WeightGemmKernels().Register(kCuda, &Fp8WeightGemmCuda);
    // The kernels before this block.
    GeluKernels().Register(kCuda, &GeluCuda);
    GeluBackwardKernels().Register(kCuda, &GeluBackwardCuda);
    BiasGeluKernels().Register(kCuda, &BiasGeluCuda);
    BiasGeluBackwardKernels().Register(kCuda, &BiasGeluBackwardCuda);
    SwiGLUKernels().Register(kCuda, &SwiGLUCuda);
    SwiGLUBackwardKernels().Register(kCuda, &SwiGLUBackwardCuda);
    BiasAddKernels().Register(kCuda, &BiasAddCuda);
    BiasAddBackwardKernels().Register(kCuda, &BiasAddBackwardCuda);
    AdamWKernels().Register(kCuda, &AdamWCuda);
    SgdKernels().Register(kCuda, &SgdCuda);
    EmbeddingLookupKernels().Register(kCuda, &EmbeddingLookupCuda);
    EmbeddingBackwardKernels().Register(kCuda, &EmbeddingBackwardCuda);
    FillKernels().Register(kCuda, &FillCuda);
    ConvertKernels().Register(kCuda, &ConvertCuda);
    ScaleKernels().Register(kCuda, &ScaleCuda);
    AddKernels().Register(kCuda, &AddCuda);
    AccumulateKernels().Register(kCuda, &AccumulateCuda);
    LayerNormForwardKernels().Register(kCuda, &LayerNormForwardCuda);
    LayerNormBackwardKernels().Register(kCuda, &LayerNormBackwardCuda);
    RMSNormForwardKernels().Register(kCuda, &RMSNormForwardCuda);
    RMSNormBackwardKernels().Register(kCuda, &RMSNormBackwardCuda);
    CrossEntropyForwardKernels().Register(kCuda, &CrossEntropyForwardCuda);
    CrossEntropyBackwardKernels().Register(kCuda, &CrossEntropyBackwardCuda);
    CrossEntropyMeanLossKernels().Register(kCuda, &CrossEntropyMeanLossCuda);
    ShardedCrossEntropyRowMaxKernels().Register(kCuda, &ShardedRowMaxCuda);
    ShardedCrossEntropySumsKernels().Register(kCuda, &ShardedSumsCuda);
    ShardedCrossEntropyLossKernels().Register(kCuda, &ShardedLossCuda);
    ShardedCrossEntropyBackwardKernels().Register(kCuda, &ShardedBackwardCuda);
    GemmKernels().Register(kCuda, &GemmCuda);
    BatchedGemmKernels().Register(kCuda, &BatchedGemmCuda);
    StridedCopyKernels().Register(kCuda, &StridedCopyCuda);
    RotaryForwardKernels().Register(kCuda, &RotaryForwardCuda);
    DropoutKernels().Register(kCuda, &DropoutCuda);
    FlashAttentionForwardKernels().Register(kCuda, &FlashAttentionForwardCuda);
    FlashAttentionBackwardKernels().Register(kCuda,
                                             &FlashAttentionBackwardCuda);
    CachedAttentionKernels().Register(kCuda, &CachedAttentionCuda);
    PagedKvWriteKernels().Register(kCuda, &PagedKvWriteCuda);
    PagedAttentionKernels().Register(kCuda, &PagedAttentionCuda);
    RotaryAtPositionsKernels().Register(kCuda, &RotaryAtPositionsCuda);
    RotaryBackwardKernels().Register(kCuda, &RotaryBackwardCuda);
    LossSumKernels().Register(kCuda, &LossSumCuda);
    LossSumGradientKernels().Register(kCuda, &LossSumGradientCuda);
    ReduceKernels().Register(kCuda, &ReduceCuda);
    MultiTensorSumOfSquaresKernels().Register(kCuda,
                                              &MultiTensorSumOfSquaresCuda);
    // Mixture of experts (moe_ops.h, grouped_gemm.h).
    MoeRouterForwardKernels().Register(kCuda, &MoeRouterForwardCuda);
    MoeRouterBackwardKernels().Register(kCuda, &MoeRouterBackwardCuda);
    MoeLoadBalancingLossKernels().Register(kCuda, &MoeLoadBalancingLossCuda);
    MoeLoadBalancingLossBackwardKernels().Register(
        kCuda, &MoeLoadBalancingLossBackwardCuda);
    MoeZLossKernels().Register(kCuda, &MoeZLossCuda);
    MoeZLossBackwardKernels().Register(kCuda, &MoeZLossBackwardCuda);
    MoeUpdateExpertBiasKernels().Register(kCuda, &MoeUpdateExpertBiasCuda);
    MoeSortTokensKernels().Register(kCuda, &MoeSortTokensCuda);
    MoePermuteKernels().Register(kCuda, &MoePermuteCuda);
    MoeUnpermuteKernels().Register(kCuda, &MoeUnpermuteCuda);
    MoeUnpermuteBackwardKernels().Register(kCuda, &MoeUnpermuteBackwardCuda);
    GroupedGemmKernels().Register(kCuda, &GroupedGemmCuda);
    GroupedGemmWeightGradKernels().Register(kCuda, &GroupedGemmWeightGradCuda);
    return true;
  }();
  return registered;
}

namespace {
const bool kRegistered = RegisterCudaKernels();
}  // namespace

}  // namespace cuda
}  // namespace ops
}  // namespace mcc
