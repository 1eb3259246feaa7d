#include "data/byte_level_bpe.h"

#include <limits>

#include "data/unicode_text.h"

namespace mcc::data {

bool ByteLevelToBytes(absl::string_view mapped, std::string* bytes) {
  // The inverse of the byte-to-unicode map: code point -> byte.
  static const auto* const kByteOf = [] {
    const std::vector<uint32_t> b2u = BytesToUnicode();
    auto* u2b = new absl::flat_hash_map<uint32_t, uint8_t>;
    for (int b = 0; b < 256; ++b) (*u2b)[b2u[b]] = static_cast<uint8_t>(b);
    return u2b;
  }();
  bytes->clear();
  for (size_t i = 0; i < mapped.size();) {
    uint32_t cp;
    const int len = DecodeUtf8(mapped, i, &cp);
    if (len == 0) return false;
    auto it = kByteOf->find(cp);
    if (it == kByteOf->end()) return false;
    bytes->push_back(static_cast<char>(it->second));
    i += len;
  }
  return true;
}

int FillByteIds(const absl::flat_hash_map<std::string, int32_t>& bytes_to_id,
                int32_t (&byte_id)[256]) {
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == bytes_to_id.end()) return b;
    byte_id[b] = it->second;
  }
  return -1;
}

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
      auto it = merges.find(BpeMergeKey(w[i], w[i + 1]));
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
