#include "parallel/data_parallel/flat_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace data_parallel {
namespace {

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

}  // namespace

int64_t FlatLayout::Append(int64_t used, int64_t numel) {
  return RoundUp(used + numel, kAlign);
}

absl::StatusOr<FlatLayout> FlatLayout::Create(const ParameterList& params,
                                              int dp_size,
                                              absl::string_view what) {
  if (dp_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": data-parallel size ", dp_size, " (must be >= 1)"));
  }
  FlatLayout l;
  l.dp_size = dp_size;
  for (const auto& p : params) {
    if (p == nullptr || !p->value.defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": parameter '", p ? p->name : "null", "' has no value"));
    }
    l.params.push_back(p);
    l.offsets.push_back(l.numel);
    l.shapes.push_back(p->value.shape());
    l.numel = Append(l.numel, p->value.numel());
  }
  l.padded_numel = RoundUp(std::max<int64_t>(l.numel, 1), kAlign * dp_size);
  return l;
}

namespace {

std::vector<FlatPiece> PiecesIn(const FlatLayout& l, int64_t lo, int64_t hi) {
  std::vector<FlatPiece> pieces;
  for (size_t i = 0; i < l.params.size(); ++i) {
    const int64_t off = l.offsets[i], end = off + NumElements(l.shapes[i]);
    const int64_t s = std::max(off, lo), e = std::min(end, hi);
    if (s >= e) continue;
    pieces.push_back({static_cast<int>(i), s - off, e - off, s - lo});
  }
  return pieces;
}

}  // namespace

std::vector<FlatPiece> FlatLayout::Pieces(int rank) const {
  const int64_t lo = rank * shard_numel();
  return PiecesIn(*this, lo, lo + shard_numel());
}

std::vector<FlatPiece> FlatLayout::WholePieces() const {
  return PiecesIn(*this, 0, padded_numel);
}

}  // namespace data_parallel
}  // namespace mcc
