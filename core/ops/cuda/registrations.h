// The CUDA kernels of the dispatch slots (core/ops/dispatch.h).
//
// Linking //core/ops/cuda:registrations (alwayslink) registers, at static
// initialisation, a DeviceType::kCUDA kernel in each of these slots, with
// the CPU kernel's contract as each op's header states it (outputs passed
// in; overwritten or accumulated alike; every dtype mix the op accepts):
//   Gelu, GeluBackward, BiasGelu,
//   BiasGeluBackward, SwiGLU, SwiGLUBackward core/ops/activation.h
//   BiasAdd, BiasAddBackward                 core/ops/bias.h
//   AdamWStep                                core/ops/adamw.h
//   SgdStep                                  core/ops/sgd.h
//   EmbeddingLookup, EmbeddingBackward       core/ops/embedding.h
//   Fill, Convert                            core/tensor_kernels.h
//   Scale, Add, Accumulate                   core/ops/elementwise.h
//   LayerNormForward/Backward,
//   RMSNormForward/Backward                  core/ops/norm.h
//   CrossEntropyForward/Backward,
//   CrossEntropyMeanLoss (synchronises: it
//   returns host values), the
//   ShardedCrossEntropy* steps               core/ops/cross_entropy.h
//   Gemm, BatchedGemm (cuBLASLt, cuBLAS
//   where it finds no algorithm)             core/ops/gemm.h
//   CheckIndexRange (synchronises: its
//   error is its result)                     core/ops/index_check.h
//   AccumulateLossTotals, PackLossTotals     core/ops/loss_totals.h
//   RowAbsMax, QuantizeRowsInt8
//   (synchronise, as CheckIndexRange)        core/ops/int8_quantize.h
//   Int8Gemm                                 core/ops/int8_gemm.h
//   StridedCopy (CopyStrided, Permute,
//   Concat, Split)                           core/ops/layout.h
//   LossSum, LossSumGradient                 core/ops/loss_sum.h
//   Reduce (Sum, SumOfSquares, L2Norm)       core/ops/reduce.h
//   MultiTensorSumOfSquares                  core/ops/multi_tensor.h
//   RotaryForward, RotaryBackward            core/ops/rotary.h
//   Dropout, DropoutBackward (the same
//   Philox stream: the CPU's masks)          core/ops/dropout.h
//     (rotary_dim up to 256)
//   FlashAttentionForward/Backward (head_dim
//   up to 256; the CPU's dropout masks)     core/ops/attention.h
//   CachedAttention (head_dim up to 256)     core/ops/cached_attention.h
//   MoeRouterForward/Backward,
//   MoeLoadBalancingLoss(Backward),
//   MoeZLoss(Backward), MoeUpdateExpertBias  core/ops/moe_router.h
//   MoeSortTokens, MoePermute, MoeUnpermute,
//   MoeUnpermuteBackward (no atomics: the
//   same bits every run; bad expert or row
//   indices give NaN rows, moe_ops.h)        core/ops/moe_permute.h
//   GroupedGemm, GroupedGemmWeightGrad
//   (cublasGemmGroupedBatchedEx, or one
//   GEMM per group, grouped_gemm.h)          core/ops/grouped_gemm.h
// Every kernel runs on the device's current stream (core/cuda/stream.h) and
// never synchronises with the host, except Reduce's and
// CrossEntropyMeanLoss's, whose ops return host values, and CheckIndexRange's,
// RowAbsMax's and QuantizeRowsInt8's, whose ops return the CPU kernel's
// error for bad data (one device-to-host read of 8 bytes each). Where the
// CPU kernel of another op reports bad data (a cross-entropy target or an
// embedding id outside the vocabulary), the CUDA kernel cannot without
// synchronising: it writes NaN
// instead (the loss and gradient row; the embedding row) and skips the id in
// the embedding backward, as norm_loss.h and embedding.h state. On a machine
// without the device a kernel returns FailedPrecondition naming the op ("Gelu:
// no CUDA device: cuda:0 requested, 0 present") and launches nothing.
//
// Numerics: fp32 arithmetic; results match the CPU kernels within the
// bounds that the gpu-tagged tests state (fp32 reduction order and 16-bit
// rounding). Fill, Convert, Scale, Add, Accumulate, BiasAdd, StridedCopy,
// LossSum, LossSumGradient, Reduce, MultiTensorSumOfSquares, Dropout and
// the embedding lookup and backward give the CPU's bits (the reductions follow
// the CPU's summation order).
//
// Other slots have no CUDA kernel yet and return Unimplemented for CUDA
// tensors (the README's CUDA section lists them).
#ifndef CORE_OPS_CUDA_REGISTRATIONS_H_
#define CORE_OPS_CUDA_REGISTRATIONS_H_

namespace mcc {
namespace ops {
namespace cuda {

// Registers the kernels (done at static initialisation when the library is
// linked; calling it again is harmless). Returns true. Thread-safe.
bool RegisterCudaKernels();

}  // namespace cuda
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_REGISTRATIONS_H_
