// Launchers for the CUDA kernels of the RowAbsMax and QuantizeRowsInt8 slots
// (core/ops/int8_quantize.h). Conventions as in elementwise.h. Both are
// exact functions of the input bits (a maximum; one correctly rounded fp32
// division and a round-to-nearest-even per element), so they give the CPU
// kernels' results bit for bit.
//
// Errors are found on the device: *bad (device memory, set by the launcher)
// receives the smallest key r * cols + (cols - 1 - c) over the offending
// elements (r, c), i.e. the first offending row and the last offending
// column in it, as the CPU kernels report them; ~0ull when none.
#ifndef CORE_OPS_CUDA_INT8_QUANTIZE_H_
#define CORE_OPS_CUDA_INT8_QUANTIZE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {

// absmax[r] = max_c |w[r, c]| of a row-major float w (wt) [rows, cols];
// offending elements are the non-finite ones.
cudaError_t RowAbsMax(const void* w, ElemType wt, int64_t rows, int64_t cols,
                      float* absmax, unsigned long long* bad,
                      cudaStream_t stream);

// scales[r] = absmax[r] / 127 and q (int8 [rows, cols]) as the op states;
// offending elements exceed absmax[r] in magnitude, are NaN, or are nonzero
// in a row whose scale is 0.
cudaError_t QuantizeRowsInt8(const void* w, ElemType wt, const float* absmax,
                             int64_t rows, int64_t cols, int8_t* q,
                             float* scales, unsigned long long* bad,
                             cudaStream_t stream);

// The key of an offending element (r, c) of a matrix with cols columns.
inline __host__ __device__ unsigned long long BadKey(int64_t r, int64_t c,
                                                     int64_t cols) {
  return static_cast<unsigned long long>(r * cols + (cols - 1 - c));
}

// Decodes a key found in *bad (not ~0ull) into its row and column.
inline void DecodeBadKey(unsigned long long key, int64_t cols, int64_t* row,
                         int64_t* col) {
  *row = static_cast<int64_t>(key / static_cast<unsigned long long>(cols));
  *col = cols - 1 -
         static_cast<int64_t>(key % static_cast<unsigned long long>(cols));
}

}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_INT8_QUANTIZE_H_
