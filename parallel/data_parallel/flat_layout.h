#ifndef PARALLEL_DATA_PARALLEL_FLAT_LAYOUT_H_
#define PARALLEL_DATA_PARALLEL_FLAT_LAYOUT_H_

// The flat-buffer layout both data-parallel implementations use: the
// replicated one (DistributedDataParallel, one layout per gradient bucket)
// and the sharded one (FullyShardedDataParallel, one per model unit).
//
// Parameters sit back to back in one flat buffer, each starting on a
// 64-byte boundary (16 fp32 elements, so every view stays cache-line
// aligned); the buffer is padded to a multiple of 16 x DP elements so that
// it splits into DP equal, aligned shards, shard r holding elements
// [r * shard_numel, (r + 1) * shard_numel). Tensor-parallel ranks hold
// parameters of equal shapes, so their layouts agree element for element.
//
// A FlatPiece is the one type for "the part of a flattened parameter that
// one rank's shard holds"; the optimizer updates exactly these pieces.
//
// Plain values: no collective calls, no device memory, no thread-safety
// concerns beyond those of a const struct.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace mcc {
namespace data_parallel {

// Elements [begin, end) of the flattened (TP-local) parameter `param` (an
// index into its layout's `params`), stored at `shard_offset` within the
// shard that holds it.
struct FlatPiece {
  int param = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t shard_offset = 0;
  int64_t numel() const { return end - begin; }
};

struct FlatLayout {
  // Parameter starts and the padding are multiples of this many elements.
  static constexpr int64_t kAlign = 16;

  // The layout of `params` in this order, split over `dp_size` shards.
  // InvalidArgument for a null parameter, one without a value, or
  // dp_size < 1; `what` names the owner in the message ("FSDP unit 3").
  static absl::StatusOr<FlatLayout> Create(const ParameterList& params,
                                           int dp_size, absl::string_view what);
  // The used length of a buffer of `used` elements after appending a
  // parameter of `numel` elements (what Create computes parameter by
  // parameter; bucketing uses it to decide where a bucket closes).
  static int64_t Append(int64_t used, int64_t numel);

  int64_t shard_numel() const { return padded_numel / dp_size; }
  // The pieces of parameters in shard `rank` (0 <= rank < dp_size), in
  // layout order.
  std::vector<FlatPiece> Pieces(int rank) const;
  // Every parameter whole, as pieces of one shard that is the whole buffer
  // (shard_offset is then the offset in the buffer): what a replica that
  // updates everything holds.
  std::vector<FlatPiece> WholePieces() const;

  ParameterList params;
  std::vector<int64_t> offsets;  // Element offset of each parameter.
  std::vector<Shape> shapes;     // TP-local shapes.
  int64_t numel = 0;             // Elements used, with alignment gaps.
  int64_t padded_numel = 0;      // A multiple of kAlign x dp_size.
  int dp_size = 1;
};

}  // namespace data_parallel
}  // namespace mcc

#endif  // PARALLEL_DATA_PARALLEL_FLAT_LAYOUT_H_
