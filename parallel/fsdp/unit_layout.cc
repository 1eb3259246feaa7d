#include "parallel/fsdp/unit_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace fsdp {
namespace {

constexpr int64_t kAlign = 16;  // fp32 elements in 64 bytes.

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

}  // namespace

absl::StatusOr<UnitLayout> UnitLayout::Create(const ParameterList& params,
                                              int dp_size) {
  if (dp_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("FSDP unit layout: data-parallel size ", dp_size));
  }
  UnitLayout u;
  u.dp_size = dp_size;
  for (const auto& p : params) {
    if (p == nullptr || !p->value.defined()) {
      return absl::InvalidArgumentError(
          "FSDP unit layout: a parameter is null or has no value");
    }
    u.params.push_back(p);
    u.offsets.push_back(u.numel);
    u.shapes.push_back(p->value.shape());
    u.numel = RoundUp(u.numel + p->value.numel(), kAlign);
  }
  u.padded_numel = RoundUp(std::max<int64_t>(u.numel, 1), kAlign * dp_size);
  return u;
}

std::vector<UnitLayout::Piece> UnitLayout::Pieces(int rank) const {
  std::vector<Piece> pieces;
  const int64_t lo = rank * shard_numel(), hi = lo + shard_numel();
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t off = offsets[i], end = off + NumElements(shapes[i]);
    const int64_t s = std::max(off, lo), e = std::min(end, hi);
    if (s >= e) continue;
    pieces.push_back({static_cast<int>(i), s - off, e - off, s - lo});
  }
  return pieces;
}

}  // namespace fsdp
}  // namespace mcc
