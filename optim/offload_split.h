#ifndef OPTIM_OFFLOAD_SPLIT_H_
#define OPTIM_OFFLOAD_SPLIT_H_

// --optimizer-offload-fraction: which of the optimizer's pieces keep their
// fp32 main weights and state in host memory (stepped by the CPU kernels)
// and which stay on the device. Whole pieces, in order, until the host's
// share of elements first reaches the fraction (Megatron's hybrid
// optimizer splits its parameters the same way: never a piece in two), so
// the realised share can exceed the fraction by at most one piece.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace mcc {
namespace optim {

// offloaded[i] says whether piece i (of `sizes[i]` elements) lives on the
// host. fraction in [0, 1]: 0 offloads nothing, 1 everything. Outside that
// range, or a negative size: InvalidArgument naming the flag.
absl::StatusOr<std::vector<bool>> SplitForOffload(
    absl::Span<const int64_t> sizes, double fraction);

}  // namespace optim
}  // namespace mcc

#endif  // OPTIM_OFFLOAD_SPLIT_H_
