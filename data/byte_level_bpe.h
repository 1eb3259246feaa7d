#ifndef DATA_BYTE_LEVEL_BPE_H_
#define DATA_BYTE_LEVEL_BPE_H_

// The merge loop of byte-level BPE, shared by GPT2BPETokenizer and
// HuggingFaceTokenizer: a piece starts as one id per byte, and the adjacent
// pair with the lowest merge rank is merged everywhere until none merges.

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace mcc::data {

// Merges keyed by (left id << 32 | right id), valued (rank, merged id).
using BpeMerges = absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>>;

// The ids of `piece`: byte_id maps each byte to its id.
std::vector<int32_t> ByteLevelBpe(absl::string_view piece,
                                  const int32_t (&byte_id)[256],
                                  const BpeMerges& merges);

}  // namespace mcc::data

#endif  // DATA_BYTE_LEVEL_BPE_H_
