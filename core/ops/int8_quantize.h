#ifndef CORE_OPS_INT8_QUANTIZE_H_
#define CORE_OPS_INT8_QUANTIZE_H_

// Symmetric per-output-channel int8 quantisation of weight matrices, for
// weight-only int8 inference (core/ops/int8_gemm.h).
//
// A weight W [rows, cols] (rows = output channels) becomes int8 Q and fp32
// scales s with, per row r,
//   s[r] = m[r] / 127 (one fp32 division), m[r] = max_c |W[r, c]|,
//   Q[r, c] = clamp(round_to_nearest_even(W[r, c] / s[r]), -127, 127)
// and Q = 0 where s[r] == 0 (an all-zero row). So |W - s Q| <= s / 2
// elementwise (the clamp only trims a quotient that the rounded s pushed a
// hair past 127). -128 is never used, so the grid is symmetric.
//
// The row maximum is a separate step so that a matrix split along its
// columns (a row-parallel layer under tensor parallelism) can take the
// maximum over the whole row (an all-reduce of m with kMax) and quantise
// every shard exactly as the unsplit matrix: the result then does not depend
// on the layout. Both steps are exact functions of the input bits (no
// reduction-order dependence), so every device gives the same Q and s.
//
// Ops follow core/ops/dispatch.h: validated once, then the device's kernel;
// outputs are overwritten.

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// absmax [rows] fp32 = max_c |w[r, c]| of a 2-D fp32, bf16 or fp16 w.
// A NaN or infinite weight is an error naming the row (nothing useful can be
// quantised from it); absmax is then unspecified.
absl::Status RowAbsMax(const Tensor& w, Tensor* absmax);

// q [rows, cols] int8 and scales [rows] fp32 from w and the row maxima
// absmax [rows] (at least this shard's own maxima; see above). An absmax
// below a row's own maximum is an error.
absl::Status QuantizeRowsInt8(const Tensor& w, const Tensor& absmax, Tensor* q,
                              Tensor* scales);

using RowAbsMaxKernel = absl::Status (*)(const Tensor& w, Tensor* absmax);
using QuantizeRowsInt8Kernel = absl::Status (*)(const Tensor& w,
                                                const Tensor& absmax, Tensor* q,
                                                Tensor* scales);
KernelSlot<RowAbsMaxKernel>& RowAbsMaxKernels();
KernelSlot<QuantizeRowsInt8Kernel>& QuantizeRowsInt8Kernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_INT8_QUANTIZE_H_
