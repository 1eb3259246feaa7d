#ifndef CORE_OPS_INDEX_CHECK_H_
#define CORE_OPS_INDEX_CHECK_H_

// Checks that token ids or targets lie in a vocabulary, where they live:
// ids are data, and on a device the host cannot look at them. The model
// calls this instead of reading ids on the host.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// Every element of ids (int32 or int64, any shape) is in [0, limit) or
// equals ignore_index. The first one that is not gives InvalidArgument
//   "<what> <id> at token <i> is outside the vocabulary of <limit>"
// (i: its flat index). Writes nothing. The CPU kernel reads the ids on the
// calling thread; a device kernel that cannot report without synchronising
// with the host states what it does instead.
// Inside a graph capture (core/graph_capture.h) of device ids, it passes
// without checking when the capture's index_inputs_checked_outside is set,
// and otherwise fails (FailedPrecondition, spoiling the capture).
absl::Status CheckIndexRange(const Tensor& ids, int64_t limit,
                             int64_t ignore_index, absl::string_view what);

using CheckIndexRangeKernel = absl::Status (*)(const Tensor& ids, int64_t limit,
                                               int64_t ignore_index,
                                               absl::string_view what);
KernelSlot<CheckIndexRangeKernel>& CheckIndexRangeKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_INDEX_CHECK_H_
