#ifndef DATA_SENTENCEPIECE_SHIM_H_
#define DATA_SENTENCEPIECE_SHIM_H_

// The interface of libmcc_sentencepiece_shim.so, the one object linked with
// Debian's libsentencepiece. That library exports symbols that clash with
// the rest of the build (the globals FLAGS_help and FLAGS_version, also
// defined by Abseil's flag library, and a bundled protobuf-lite under
// google::protobuf), so linking it into a binary corrupts those at start or
// exit. SentencePieceModel therefore loads the shim with dlopen(RTLD_LOCAL |
// RTLD_DEEPBIND): the library then binds to its own copies and the binary
// never sees them. Standard types only: sentencepiece_processor.h declares
// absl::string_view as std::string_view, which clashes with Debian's Abseil.

#include <string>
#include <string_view>
#include <vector>

namespace mcc::data {

// One loaded model. All methods are const and thread-safe.
class SentencePieceShim {
 public:
  virtual ~SentencePieceShim() = default;
  virtual int piece_size() const = 0;
  virtual int eos_id() const = 0;
  virtual int bos_id() const = 0;
  virtual bool Encode(std::string_view text, std::vector<int>* ids,
                      std::string* error) const = 0;
  virtual bool Decode(const std::vector<int>& ids, std::string* text,
                      std::string* error) const = 0;
};

}  // namespace mcc::data

// Loads a .model file (from_serialized false) or a serialized ModelProto.
// Returns null and sets *error on failure. The caller owns the result.
extern "C" mcc::data::SentencePieceShim* mcc_sentencepiece_shim_load(
    const std::string* path_or_bytes, bool from_serialized, std::string* error);
using MccSentencePieceShimLoad = decltype(&mcc_sentencepiece_shim_load);

#endif  // DATA_SENTENCEPIECE_SHIM_H_
