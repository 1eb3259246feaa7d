#ifndef CORE_OPS_GEMM_H_
#define CORE_OPS_GEMM_H_

// Matrix products on row-major matrices, through oneDNN on the CPU.
//
// Raw:     C = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T, with
//          op(A) m x k, op(B) k x n, C m x n and leading dimensions (row
//          strides) lda, ldb, ldc as stored. beta == 0 never reads C (NaNs in
//          C do not propagate).
// Tensor:  the same on 2-D (Gemm) or 3-D (BatchedGemm) tensors, with every
//          argument checked before anything is written.
//
// bf16 inputs accumulate in fp32, through one of two paths: oneDNN's native
// bf16 matmul (where the CPU has AVX512-BF16 or AMX) or the fp32 GEMM on
// inputs widened to fp32 (vectorised, in panels). Neither is always faster:
// on one AVX512-BF16 Xeon the native path ran at half the widened one's
// rate. So the path is chosen per shape class by timing (Bf16PathPolicy
// below); AVX2-only machines always widen. oneDNN's OpenMP threads follow
// ThreadPool::Global().num_threads(). fp16 inputs are always widened to fp32
// (F16C) and run the fp32 GEMM.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/half.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

void GemmF32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc);

void GemmBF16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
              float alpha, const BFloat16* a, int64_t lda, const BFloat16* b,
              int64_t ldb, float beta, float* c, int64_t ldc);

// fp16 operands, widened to fp32 in panels; fp32 accumulation and output.
void GemmF16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const Float16* a, int64_t lda, const Float16* b,
             int64_t ldb, float beta, float* c, int64_t ldc);

enum class GemmPath {
  kConvertToF32,  // 16-bit operands widened to fp32, oneDNN sgemm.
  kNativeBF16,    // oneDNN bf16 matmul (AVX512-BF16 or AMX kernels).
};
// "widened" or "native".
const char* GemmPathName(GemmPath path);

// Whether oneDNN has native bf16 kernels on this CPU, and which ("AMX",
// "AVX512-BF16" or "none").
bool NativeBf16Available();
const char* NativeBf16Isa();

// How GemmBF16 picks its path. kAuto (the default) times both paths on the
// first GEMM of each shape class (transposes, m, n, k and thread count; a
// one-thread GEMM by its thread's CPU time, so that other jobs on the
// machine do not decide) and keeps the faster one for the rest of the
// process; the native path must be
// at least 10% faster to be chosen. GEMMs under 4 MFLOP and CPUs without
// native bf16 always run widened. The environment variable
// MCC_BF16_GEMM_PATH=auto|native|widened sets the policy for the process.
// Thread-safe: concurrent callers of a new shape wait for one measurement.
enum class Bf16PathPolicy { kAuto, kNative, kWidened };

struct Bf16GemmShape {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int threads = 1;  // oneDNN threads the GEMM runs on.

  bool operator==(const Bf16GemmShape& o) const {
    return trans_a == o.trans_a && trans_b == o.trans_b && m == o.m &&
           n == o.n && k == o.k && threads == o.threads;
  }
  template <typename H>
  friend H AbslHashValue(H h, const Bf16GemmShape& s) {
    return H::combine(std::move(h), s.trans_a, s.trans_b, s.m, s.n, s.k,
                      s.threads);
  }
};

struct Bf16GemmChoice {
  Bf16GemmShape shape;
  GemmPath path = GemmPath::kConvertToF32;
  bool measured = false;
  // As measured on first use: flops per (CPU seconds / threads).
  double native_gflops = 0, widened_gflops = 0;
};

// The shape classes measured so far in this process, in first-use order.
std::vector<Bf16GemmChoice> Bf16GemmChoices();
// "m=2048 n=1536 k=512 NT (2 threads): native 170.2 GFLOP/s, widened 301.5
// GFLOP/s -> widened".
std::string FormatBf16GemmChoice(const Bf16GemmChoice& choice);

// c = alpha * op(a) * op(b) + beta * c for 2-D tensors: op(a) [m, k],
// op(b) [k, n], c [m, n]. a and b are both fp32, both bf16 or both fp16; c
// is fp32, bf16 or fp16 (a 16-bit c is computed in fp32 and rounded once).
// Parameter-gradient accumulation (Megatron's gradient-accumulation fusion) is
// beta = 1 into an fp32 c, e.g. dW += dY^T X: Gemm(dy, true, x, false, &dw, 1,
// 1).
absl::Status Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                  Tensor* c, float alpha = 1.0f, float beta = 0.0f);

// Per batch entry: a [batch, ., .], b [batch, ., .] or a 2-D b shared by
// every entry, c [batch, m, n]. Dtype rules as Gemm.
absl::Status BatchedGemm(const Tensor& a, bool trans_a, const Tensor& b,
                         bool trans_b, Tensor* c, float alpha = 1.0f,
                         float beta = 0.0f);

// Kernels (core/ops/dispatch.h), called after validation with the op's
// arguments: c is overwritten (beta == 0, never read) or accumulated into
// (beta != 0), on the device's current stream, without host
// synchronisation.
using GemmKernel = absl::Status (*)(const Tensor& a, bool trans_a,
                                    const Tensor& b, bool trans_b, Tensor* c,
                                    float alpha, float beta);
KernelSlot<GemmKernel>& GemmKernels();
KernelSlot<GemmKernel>& BatchedGemmKernels();

namespace internal {
// While alive, bf16 path choices (Bf16PathPolicy::kAuto) made on this thread
// key m, n and k each rounded up to a power of two; the GEMM timed is still
// the call's own. For GEMMs whose sizes change call by call (the grouped
// GEMM's experts, core/ops/grouped_gemm.h, whose row counts change every
// step), so that they share one measurement per class instead of timing
// both paths at every new size; their native-path GEMMs also share one
// oneDNN primitive with runtime m, k and leading dimensions instead of
// creating one per size. Nests; other threads are unaffected.
class ScopedBf16ShapeClass {
 public:
  ScopedBf16ShapeClass();
  ~ScopedBf16ShapeClass();
  ScopedBf16ShapeClass(const ScopedBf16ShapeClass&) = delete;
  ScopedBf16ShapeClass& operator=(const ScopedBf16ShapeClass&) = delete;

 private:
  bool saved_;
};

// While alive, CPU GEMMs called on this thread run on this thread alone
// (oneDNN's OpenMP team of one): for loops that already spread GEMMs over
// the pool's threads (BatchedGemm of small matrices, the grouped GEMM of
// many small experts). Nests; other threads are unaffected.
class ScopedSingleThreadedGemm {
 public:
  ScopedSingleThreadedGemm();
  ~ScopedSingleThreadedGemm();
  ScopedSingleThreadedGemm(const ScopedSingleThreadedGemm&) = delete;
  ScopedSingleThreadedGemm& operator=(const ScopedSingleThreadedGemm&) = delete;

 private:
  int saved_;
};

// The bf16 path policy in effect (MCC_BF16_GEMM_PATH or the test setter).
Bf16PathPolicy CurrentBf16PathPolicy();

// Sets oneDNN's OpenMP team for a GEMM about to run on this thread (the
// pool's size, or one under ScopedSingleThreadedGemm), for oneDNN primitives
// run outside this file (core/ops/expert_weight_packing.h).
void SyncGemmOmpThreads();

// For tests: force the oneDNN matmul-primitive path (normally only taken for
// native bf16) for fp32 too, so its strides, alpha and beta are checked on
// machines without AVX512-BF16. Returns the previous setting.
bool SetForceMatmulPrimitiveForTesting(bool force);
// Primitives created so far by the matmul-primitive path (cache misses).
int64_t MatmulPrimitivesCreated();
// For tests: native bf16 GEMMs with at least this many rows (default 512)
// pack B once before oneDNN runs; returns the previous value.
int64_t SetBf16PackBMinRowsForTesting(int64_t rows);
// For tests: the widening path converts bf16 operands in panels of at most
// this many elements (default 4M); returns the previous value.
int64_t SetBf16WidenPanelForTesting(int64_t elements);
// For tests: sets the bf16 path policy (overriding MCC_BF16_GEMM_PATH);
// returns the previous one.
Bf16PathPolicy SetBf16PathPolicyForTesting(Bf16PathPolicy policy);
// For tests: forgets every measured choice.
void ClearBf16GemmChoicesForTesting();
}  // namespace internal

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_GEMM_H_
