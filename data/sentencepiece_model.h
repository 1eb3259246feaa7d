#ifndef DATA_SENTENCEPIECE_MODEL_H_
#define DATA_SENTENCEPIECE_MODEL_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mcc::data {

// A loaded SentencePiece model: Debian's libsentencepiece, reached through
// libmcc_sentencepiece_shim.so, which this class loads on first use with
// dlopen(RTLD_LOCAL | RTLD_DEEPBIND) so that the library's clashing symbols
// stay private (see sentencepiece_shim.h). The shim is found, in order, at
// $MCC_SENTENCEPIECE_SHIM, in the running binary's Bazel runfiles
// (data/libmcc_sentencepiece_shim.so), or beside the binary.
//
// Thread-safety: every method is const and may be called from several
// threads at once (the library's encoder keeps no per-call state).
class SentencePieceModel {
 public:
  ~SentencePieceModel();

  // Reads a .model file. On failure returns null and sets *error to the
  // library's message prefixed with the path.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path,
                                                  std::string* error);
  // The same from a serialized ModelProto; `label` names it in errors.
  static std::unique_ptr<SentencePieceModel> LoadFromSerialized(
      std::string_view serialized, const std::string& label,
      std::string* error);

  // Whether the shim loads in this process (not in an AddressSanitizer
  // build, whose runtime refuses RTLD_DEEPBIND); *why says why not.
  static bool Available(std::string* why);

  int piece_size() const;
  int eos_id() const;  // -1 when the model has none
  int bos_id() const;

  // The library's Encode/Decode. False with *error set on failure.
  bool Encode(std::string_view text, std::vector<int>* ids,
              std::string* error) const;
  bool Decode(const std::vector<int>& ids, std::string* text,
              std::string* error) const;

 private:
  struct Impl;
  explicit SentencePieceModel(std::unique_ptr<Impl> impl);
  static std::unique_ptr<SentencePieceModel> LoadShim(
      const std::string& path_or_bytes, bool from_serialized,
      const std::string& label, std::string* error);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mcc::data

#endif  // DATA_SENTENCEPIECE_MODEL_H_
