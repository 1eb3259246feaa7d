#ifndef DATA_BYTE_LEVEL_BPE_H_
#define DATA_BYTE_LEVEL_BPE_H_

// What GPT2BPETokenizer and HuggingFaceTokenizer share of byte-level BPE:
// reading tokens written in GPT-2's byte-to-unicode alphabet back into
// bytes, the merge keys, and the merge loop (a piece starts as one id per
// byte, and the adjacent pair with the lowest merge rank is merged
// everywhere until none merges). Internal to //data's tokenizers.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace mcc::data {

// Merges keyed by (left id << 32 | right id), valued (rank, merged id).
using BpeMerges = absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>>;

// The key of the merge of `left` and `right` in BpeMerges.
inline uint64_t BpeMergeKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}

// The bytes that `mapped`, a token as vocabularies and merge lists write it
// (in GPT-2's byte-to-unicode alphabet, BytesToUnicode), stands for. False
// when `mapped` is not UTF-8 or holds a character outside that alphabet.
bool ByteLevelToBytes(absl::string_view mapped, std::string* bytes);

// Fills byte_id[b] with the id of the one-byte token b of `bytes_to_id`.
// Returns the first byte that has no token, or -1 when every byte has one.
int FillByteIds(const absl::flat_hash_map<std::string, int32_t>& bytes_to_id,
                int32_t (&byte_id)[256]);

// The ids of `piece`: byte_id maps each byte to its id.
std::vector<int32_t> ByteLevelBpe(absl::string_view piece,
                                  const int32_t (&byte_id)[256],
                                  const BpeMerges& merges);

}  // namespace mcc::data

#endif  // DATA_BYTE_LEVEL_BPE_H_
