#ifndef CORE_OPS_LOSS_TOTALS_H_
#define CORE_OPS_LOSS_TOTALS_H_

// A step's loss over its micro-batches, totalled on the device so that the
// trainer reads it once per step, with the gradient statistics, in a single
// device-to-host copy.
//
// Loss totals are an fp32 [kLossTotalsSize] tensor holding three float64
// values, each kept exactly as three fp32 parts (v = (double(p0) +
// double(p1)) + double(p2), p0 = float(v), p1 = float(v - p0), p2 =
// float(v - p0 - p1); an inf or NaN v is kept in p0 alone):
//   [0..2]  sum over micro-batches of (sum / tokens) / num_microbatches,
//           Megatron's loss (a micro-batch without tokens adds 0);
//   [3..5]  sum of the micro-batches' loss sums;
//   [6..8]  sum of their token counts.
// Each addition happens in float64 in micro-batch order, so the totals are
// the host loop's float64 values, bit for bit, on every device.
//
// To sum totals over ranks in fp32 (an all-reduce), PackLossTotals turns
// them into ops::LossSum's hi/lo pairs (about 48 bits each).

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

inline constexpr int64_t kLossTotalsSize = 9;
inline constexpr int64_t kPackedLossTotalsSize = 6;

// Adds one micro-batch's loss sum (ops::LossSum's fp32 [4]: sum and token
// count as hi/lo pairs) to `totals` (fp32 [kLossTotalsSize], same device;
// zero it before the first micro-batch). num_microbatches > 0 is the
// divisor of the mean. Accumulates; no host synchronisation.
absl::Status AccumulateLossTotals(const Tensor& loss_sum, int num_microbatches,
                                  Tensor* totals);

// Overwrites `packed` (fp32 [kPackedLossTotalsSize], same device) with the
// three values of `totals` as hi/lo pairs (hi = float(v), lo = float(v -
// hi)), in the same order. No host synchronisation.
absl::Status PackLossTotals(const Tensor& totals, Tensor* packed);

// The three values, on the host.
struct LossTotalValues {
  double mean_of_means = 0;
  double sum = 0;
  double tokens = 0;
};
// From host copies of the kLossTotalsSize values of totals, or of the
// kPackedLossTotalsSize values of packed totals (summed over ranks or not).
// InvalidArgument for any other length.
absl::StatusOr<LossTotalValues> LossTotalsFromHost(
    absl::Span<const float> values);

using AccumulateLossTotalsKernel = absl::Status (*)(const Tensor& loss_sum,
                                                    int num_microbatches,
                                                    Tensor* totals);
using PackLossTotalsKernel = absl::Status (*)(const Tensor& totals,
                                              Tensor* packed);
KernelSlot<AccumulateLossTotalsKernel>& AccumulateLossTotalsKernels();
KernelSlot<PackLossTotalsKernel>& PackLossTotalsKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_LOSS_TOTALS_H_
