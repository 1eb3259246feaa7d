#ifndef CORE_OPS_ATTENTION_H_
#define CORE_OPS_ATTENTION_H_

// Fused multi-head self-attention, flash-style (FlashAttention-2 on the CPU):
// softmax(scale * q k^T [+ causal mask]) v without ever materialising a
// [seq, seq] matrix. Memory is linear in the sequence length.
//
// Layout (the whole attention stack uses it): [batch, seq, heads, head_dim].
//   q    [b, s, num_heads, d]      fp32 or bf16
//   k, v [b, s, num_kv_heads, d]   fp32 or bf16 (num_kv_heads divides
//                                  num_heads: grouped-query attention; query
//                                  head h reads kv head h / (num_heads /
//                                  num_kv_heads), as Megatron's GQA)
//   out  [b, s, num_heads, d]      fp32 or bf16; reshapes to [b*s, h*d] for
//                                  the output projection with no copy
//   lse  [b, num_heads, s]         fp32, the per-row logsumexp of the scaled
//                                  scores, saved for the backward
// The backward recomputes the probabilities block by block from q, k and lse
// (D = rowsum(dout * out)) and overwrites dq, dk, dv (shapes and dtype rules
// of q, k, v); attention dropout is optional (AttentionOptions).
// Everything is validated before anything is written; all tensors live on
// one device and each op runs its slot's kernel (core/ops/dispatch.h: the
// device's current stream, no host synchronisation); a device without a
// kernel gets Unimplemented naming the op.
//
// Parallelism: the forward runs (batch, head, query block) tasks; the
// backward runs one task per (batch, kv head), so it uses at most
// b * num_kv_heads threads.

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

struct AttentionOptions {
  bool causal = true;          // Query i sees keys 0..i.
  float softmax_scale = 0.0f;  // 0: 1 / sqrt(head_dim).
  // Dropout on the attention probabilities (Megatron's attention dropout),
  // with the counter-based generator of core/ops/dropout.h: probability
  // (b, head, i, j) is kept when word
  //   dropout_offset + ((b * total_heads + head_offset + head) * s + i) * s + j
  // of dropout_seed's stream passes, as ops::Dropout decides. Heads are
  // numbered globally (head_offset: this tensor-parallel rank's first head,
  // total_heads: all of them; 0 means num_heads), so every TP rank draws the
  // serial model's masks for its own heads. The backward must get the same
  // options.
  float dropout_p = 0.0f;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;
  int64_t head_offset = 0;
  int64_t total_heads = 0;
  // Packed documents (--reset-attention-mask) and sliding windows
  // (--window-size): int32 [batch, seq] on the host or on q's device, the
  // first key each query row may see. Query i of batch entry bi sees key j only
  // when j >= first_key[bi, i] (and j <= i when causal). A document mask is the
  // index of the row's document start; a window of w keys raises it to
  // i - w + 1. Undefined: no lower limit. Values may lie outside [0, seq]:
  // a row that sees no key at all gets out 0 and lse -inf (a context-
  // parallel ring step with a key chunk wholly before the row's document).
  // No [seq, seq] mask is built: key blocks wholly below a query block's
  // smallest first key are skipped, so the cost falls with the documents'
  // lengths. The CUDA kernels skip tiles alike; they copy a host first_key
  // to the device on every call, so a caller that makes many calls with one
  // (the inference engine's layers) uploads it once and passes that.
  Tensor first_key;
};

absl::Status FlashAttentionForward(const Tensor& q, const Tensor& k,
                                   const Tensor& v,
                                   const AttentionOptions& options, Tensor* out,
                                   Tensor* lse);

absl::Status FlashAttentionBackward(const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out,
                                    const Tensor& dout, const Tensor& lse,
                                    const AttentionOptions& options, Tensor* dq,
                                    Tensor* dk, Tensor* dv);

// How the CPU kernels multiply bf16 inputs. kDotProduct: q, k, v (and dout
// in the backward) stay bf16 and the block products run through the
// AVX512-BF16 dot-product instruction with fp32 accumulation; the
// probabilities and dS, computed in fp32, are rounded to bf16 for the
// products that take them (as GPU flash attention does). kWidened: every
// operand is widened to fp32 and multiplied in fp32 (any machine; fp32 and
// fp16 inputs always take it).
enum class CpuBf16AttentionPath { kWidened, kDotProduct };
// kDotProduct where the CPU has AVX512-BF16 and the kernel ISA is AVX-512
// (MCC_CPU_ISA=avx2 rules it out). MCC_BF16_ATTENTION=widened forces
// kWidened; =dot requires the instruction; =auto (or unset) chooses.
CpuBf16AttentionPath CpuBf16AttentionPathInUse();
const char* CpuBf16AttentionPathName(CpuBf16AttentionPath path);

namespace internal {
// For tests: the bf16 path from now on (kDotProduct only where the CPU has
// it); returns the previous choice.
CpuBf16AttentionPath SetCpuBf16AttentionPathForTesting(
    CpuBf16AttentionPath path);
}  // namespace internal

}  // namespace ops

namespace kernel_slot_internal {
// On a host-backed device (the test device) the CPU kernels read first_key
// through a host view, as they read the op's other tensors: it may live on
// q's device.
template <>
struct HostArg<const ops::AttentionOptions&> {
  explicit HostArg(const ops::AttentionOptions& o) : options(o) {
    options.first_key = HostView(o.first_key);
  }
  operator const ops::AttentionOptions&() const { return options; }  // NOLINT
  ops::AttentionOptions options;
};
}  // namespace kernel_slot_internal

namespace ops {

// Kernels, with the ops' signatures and contracts (out, lse, dq, dk, dv
// overwritten; dropout masks drawn as AttentionOptions says).
using FlashAttentionForwardKernel =
    absl::Status (*)(const Tensor& q, const Tensor& k, const Tensor& v,
                     const AttentionOptions& options, Tensor* out, Tensor* lse);
using FlashAttentionBackwardKernel = absl::Status (*)(
    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
    const Tensor& dout, const Tensor& lse, const AttentionOptions& options,
    Tensor* dq, Tensor* dk, Tensor* dv);
KernelSlot<FlashAttentionForwardKernel>& FlashAttentionForwardKernels();
KernelSlot<FlashAttentionBackwardKernel>& FlashAttentionBackwardKernels();

// Useful floating-point operations of one call (causal counts the lower
// triangle only), for benchmarks: forward 4*b*h*s*s*d (halved when causal),
// backward 2.5 times that.
double FlashAttentionForwardFlops(int64_t batch, int64_t seq, int64_t heads,
                                  int64_t head_dim, bool causal);
double FlashAttentionBackwardFlops(int64_t batch, int64_t seq, int64_t heads,
                                   int64_t head_dim, bool causal);

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_ATTENTION_H_
