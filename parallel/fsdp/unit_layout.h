#ifndef PARALLEL_FSDP_UNIT_LAYOUT_H_
#define PARALLEL_FSDP_UNIT_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/parameter.h"
#include "core/tensor.h"

namespace mcc {
namespace fsdp {

// Where one unit's parameters sit in its flat buffer, and which equal,
// contiguous stretch of that buffer each data-parallel rank holds. Every
// parameter starts on a 64-byte boundary; the buffer is padded to a multiple
// of 16 x DP elements so shards are equal and aligned. Tensor-parallel ranks
// hold equal shapes, so their layouts agree element for element.
struct UnitLayout {
  // The piece of parameter `param` in `rank`'s shard: elements [begin, end)
  // of the flattened parameter, at `shard_offset` within the shard.
  struct Piece {
    int param = 0;
    int64_t begin = 0;
    int64_t end = 0;
    int64_t shard_offset = 0;
  };

  static absl::StatusOr<UnitLayout> Create(const ParameterList& params,
                                           int dp_size);

  int64_t shard_numel() const { return padded_numel / dp_size; }
  // The pieces of parameters in `rank`'s shard, in layout order.
  std::vector<Piece> Pieces(int rank) const;

  ParameterList params;
  std::vector<int64_t> offsets;  // Element offset of each parameter.
  std::vector<Shape> shapes;     // TP-local shapes.
  int64_t numel = 0;             // Elements used, with alignment gaps.
  int64_t padded_numel = 0;
  int dp_size = 1;
};

}  // namespace fsdp
}  // namespace mcc

#endif  // PARALLEL_FSDP_UNIT_LAYOUT_H_
