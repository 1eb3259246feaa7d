#include "data/byte_level_bpe.h"

#include <limits>

namespace mcc::data {

std::vector<int32_t> ByteLevelBpe(absl::string_view piece,
                                  const int32_t (&byte_id)[256],
                                  const BpeMerges& merges) {
  std::vector<int32_t> w;
  w.reserve(piece.size());
  for (unsigned char c : piece) w.push_back(byte_id[c]);
  std::vector<int32_t> next;
  while (w.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    int32_t a = -1, b = -1, merged = -1;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      auto it = merges.find((static_cast<uint64_t>(w[i]) << 32) |
                            static_cast<uint32_t>(w[i + 1]));
      if (it != merges.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        a = w[i];
        b = w[i + 1];
        merged = it->second.second;
      }
    }
    if (merged < 0) break;
    next.clear();
    for (size_t i = 0; i < w.size();) {
      if (w[i] == a && i + 1 < w.size() && w[i + 1] == b) {
        next.push_back(merged);
        i += 2;
      } else {
        next.push_back(w[i]);
        ++i;
      }
    }
    w.swap(next);
  }
  return w;
}

}  // namespace mcc::data
