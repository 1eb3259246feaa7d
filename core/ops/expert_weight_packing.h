#ifndef CORE_OPS_EXPERT_WEIGHT_PACKING_H_
#define CORE_OPS_EXPERT_WEIGHT_PACKING_H_

// The experts' weights of the CPU grouped GEMM (core/ops/grouped_gemm.h)
// kept in oneDNN's blocked weights layout across calls, for as long as the
// caller promises they do not change.
//
// A small group (at most kPackedMaxRows rows) does too little work per byte
// of its weight for oneDNN's per-call repacking of it to be cheap: 64
// experts of 64 rows ran the forward at 63-70% of one dense GEMM's rate.
// While a ScopedExpertWeightPacking lives on the calling thread, the grouped
// GEMM instead reorders each expert's op(w_g) once, on its first use in the
// scope, into the layout oneDNN's brgemm matmul reads directly, and runs
// that expert's rows through a matmul primitive of the group's exact row
// count (at most kPackedMaxRows primitives per shape, kept for the
// process). Every micro-batch's forward (trans_w) and, for bf16, data
// gradient (!trans_w: a second packed copy) of a training step then share
// one pack. fp32's data gradient stays unpacked (it ran as fast without).
//
// Contract: the weight tensors given to GroupedGemm do not change while the
// scope lives (one training step's forward and backward passes; the
// optimizer step comes after the scope ends). The packs are freed when the
// scope ends: that is the invalidation. A pack is keyed by the weight's
// address, shape, dtype and transposition and holds the weight's storage,
// so the address cannot be reused by another tensor inside the scope.
//
// Memory: one packed copy of each weight per transposition packed (the
// MoE layer's fc1 and fc2: the expert weights once for fp32, twice for
// bf16), in 2 MiB-aligned buffers (2 MiB pages requested). When the scope
// ends they go idle and the next scope reuses those of the same size (the
// next step's), so the process keeps one scope's peak until
// FreeIdleExpertWeightPacks. The first call in a scope pays the packing
// (64 experts of h512 f256: fp32 ~3x a forward call, bf16 ~1x; see
// docs/benchmarks/2026-12-05.md), so it gains with several micro-batches.
// Results: brgemm's fp32 accumulation of the same products in its own order,
// within the grouped GEMM's stated bounds but not bit for bit those of the
// unpacked path. Only fp32 weights, and bf16 where oneDNN has native bf16
// kernels (packed bf16 groups run them without the per-shape timing of
// core/ops/gemm.h; not at all under MCC_BF16_GEMM_PATH=widened); fp16 and
// the weight gradient are unchanged. Without a scope nothing changes.

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// Largest group (rows) that takes the packed path.
constexpr int64_t kPackedMaxRows = 128;

namespace internal {
class ExpertWeightPacks;
}  // namespace internal

// Whether groups of `dtype` (fp32 or bf16) take the packed path on this CPU
// (oneDNN has brgemm kernels for it).
bool ExpertWeightPackingAvailable(DType dtype);

// Bytes of ended scopes' pack buffers held for reuse, and their release.
int64_t IdleExpertWeightPackBytes();
void FreeIdleExpertWeightPacks();

// Nests: the innermost scope on a thread is the one used. Not copyable.
class ScopedExpertWeightPacking {
 public:
  ScopedExpertWeightPacking();
  ~ScopedExpertWeightPacking();
  ScopedExpertWeightPacking(const ScopedExpertWeightPacking&) = delete;
  ScopedExpertWeightPacking& operator=(const ScopedExpertWeightPacking&) =
      delete;

  // Expert matrices packed so far in this scope, and their bytes.
  int64_t packed_matrices() const;
  int64_t packed_bytes() const;

 private:
  std::unique_ptr<internal::ExpertWeightPacks> packs_;
  internal::ExpertWeightPacks* saved_;
};

namespace internal {

// The calling thread's innermost scope's packs, or null.
ExpertWeightPacks* CurrentExpertWeightPacks();

// yg = xg op(w_g) + beta yg through w_g's pack (made on first use): xg
// [rows, K] and yg [rows, N] contiguous CPU tensors, w the whole [G, ., .]
// weight. Returns false, having done nothing, where the packed path does not
// apply (dtypes, rows, no brgemm kernel on this CPU); the caller then runs
// its ordinary GEMM.
absl::StatusOr<bool> PackedExpertGemm(ExpertWeightPacks* packs, const Tensor& w,
                                      bool trans_w, int64_t g, const Tensor& xg,
                                      Tensor* yg, float beta);

}  // namespace internal
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_EXPERT_WEIGHT_PACKING_H_
