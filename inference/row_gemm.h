#ifndef INFERENCE_ROW_GEMM_H_
#define INFERENCE_ROW_GEMM_H_

// A GEMM whose every output row is computed the same way whatever the number
// of rows: the inference engine batches the tokens of many requests into one
// matrix, and a request's output must not change with the company it keeps
// (tuned libraries pick kernels and blockings by the row count, which moves
// the float rounding).
//
// The fixed order: every output y[m, n] is one chain of fused multiply-adds
// over k in increasing order, starting from 0:
//   s = 0; for i in 0..k-1: s = fma(x[m, i], w[n, i], s)
// (for int8 weights w[n, i] is q[n, i] widened exactly, and the finished sum
// is multiplied once by scales[n]). The kernels vectorise across output
// columns, never across k, so the result is the same bits for any row count,
// any other rows, any thread count and either kernel ISA (AVX2 or AVX-512,
// ops::KernelIsa()): a scalar loop of std::fma reproduces it exactly.

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace mcc {
namespace inference {

// Weights [cols, k] (fp32, or int8 with fp32 per-column scales) packed once
// into the layout the kernels stream: panels of 16 columns, each [k][16]
// contiguous and 64-byte aligned, the last panel zero-padded. Immutable
// after construction, so any number of threads may read one; movable, not
// copyable.
class RowGemmWeights {
 public:
  RowGemmWeights() = default;
  // Copies w [cols, k] row-major fp32.
  static RowGemmWeights Pack(const float* w, int64_t cols, int64_t k);
  // Copies q [cols, k] row-major int8 and scales [cols].
  static RowGemmWeights PackInt8(const int8_t* q, const float* scales,
                                 int64_t cols, int64_t k);

  int64_t cols() const { return cols_; }
  int64_t k() const { return k_; }
  bool is_int8() const { return int8_ != nullptr; }
  int64_t panels() const { return (cols_ + kPanel - 1) / kPanel; }
  // Bytes held (values and scales).
  int64_t bytes() const;
  // Row c of the fp32 weights given to Pack (w[c, 0..k)) into out[k].
  void UnpackRow(int64_t c, float* out) const;

  static constexpr int64_t kPanel = 16;

  // Panel p's [k][16] values (fp32 or int8) and, for int8, its 16 scales.
  const float* f32_panel(int64_t p) const {
    return f32_.get() + p * k_ * kPanel;
  }
  const int8_t* int8_panel(int64_t p) const {
    return int8_.get() + p * k_ * kPanel;
  }
  const float* scales_panel(int64_t p) const {
    return scales_.get() + p * kPanel;
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  int64_t cols_ = 0, k_ = 0;
  std::unique_ptr<float[], Free> f32_;
  std::unique_ptr<int8_t[], Free> int8_;
  std::unique_ptr<float[], Free> scales_;  // [panels * 16], zero-padded
};

// y[m, n] = sum_k x[m, k] * w[n, k] for row-major x [rows, w.k()] and y
// [rows, w.cols()] (overwritten), in the fixed order above. Uses the global
// thread pool (core/thread_pool.h); safe to call from one thread at a time
// per pool loop (the pool's rule).
void RowGemm(const float* x, int64_t rows, const RowGemmWeights& w, float* y);

// Conveniences that pack w on every call (tests, benchmarks, one-off
// products); the same results as packing once.
void RowGemm(const float* x, int64_t rows, int64_t k, const float* w,
             int64_t cols, float* y);
// Weight-only int8 (core/ops/int8_gemm.h's contract): q [cols, k] int8 with
// fp32 per-row scales [cols]; y[m, n] = scales[n] * (the fixed-order sum of
// x[m, i] * q[n, i]).
void RowGemmInt8(const float* x, int64_t rows, int64_t k, const int8_t* q,
                 const float* scales, int64_t cols, float* y);

// sum_i a[i] * b[i] in RowGemm's fixed order (one output of it).
float FixedOrderDot(const float* a, const float* b, int64_t n);

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_ROW_GEMM_H_
