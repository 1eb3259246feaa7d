// The body of libmcc_sentencepiece_shim.so: see sentencepiece_shim.h. Only
// the standard library and sentencepiece here.
#include "data/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

#include <memory>

namespace mcc::data {
namespace {

class Shim : public SentencePieceShim {
 public:
  sentencepiece::SentencePieceProcessor processor;

  int piece_size() const override { return processor.GetPieceSize(); }
  int eos_id() const override { return processor.eos_id(); }
  int bos_id() const override { return processor.bos_id(); }
  bool Encode(std::string_view text, std::vector<int>* ids,
              std::string* error) const override {
    const sentencepiece::util::Status s = processor.Encode(text, ids);
    if (!s.ok()) *error = s.ToString();
    return s.ok();
  }
  bool Decode(const std::vector<int>& ids, std::string* text,
              std::string* error) const override {
    const sentencepiece::util::Status s = processor.Decode(ids, text);
    if (!s.ok()) *error = s.ToString();
    return s.ok();
  }
};

}  // namespace
}  // namespace mcc::data

extern "C" __attribute__((visibility("default"))) mcc::data::SentencePieceShim*
mcc_sentencepiece_shim_load(const std::string* path_or_bytes,
                            bool from_serialized, std::string* error) {
  auto shim = std::make_unique<mcc::data::Shim>();
  const sentencepiece::util::Status s =
      from_serialized ? shim->processor.LoadFromSerializedProto(*path_or_bytes)
                      : shim->processor.Load(*path_or_bytes);
  if (!s.ok()) {
    *error = s.ToString();
    return nullptr;
  }
  return shim.release();
}
