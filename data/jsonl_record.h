#ifndef DATA_JSONL_RECORD_H_
#define DATA_JSONL_RECORD_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace mcc::data {

// Reads the string members of jsonl records (one JSON object a line), the
// hot path of preprocess_data, with simdjson (Debian's libsimdjson-dev): a
// fully validating parse, UTF-8 included, at several GB/s.
//
// Not thread-safe: the reader keeps simdjson's buffers between records, so
// use one per thread. Views it returns are valid until the next Read().
class JsonlRecordReader {
 public:
  JsonlRecordReader();
  ~JsonlRecordReader();
  JsonlRecordReader(const JsonlRecordReader&) = delete;
  JsonlRecordReader& operator=(const JsonlRecordReader&) = delete;

  // Parses `line` as one JSON object and sets (*values)[k] to the decoded
  // string value of its top-level member keys[k], or nullopt when absent
  // (with a key given twice, the first counts). Errors (InvalidArgument):
  // the line is not valid JSON, UTF-8 included ("column C: <why>", the
  // column from a second parse with nlohmann-json, which says where), is not
  // an object, or a key holds something other than a string.
  absl::Status Read(absl::string_view line, absl::Span<const std::string> keys,
                    std::vector<std::optional<std::string_view>>* values);

 private:
  // simdjson's parser, kept out of this header: simdjson.h is large and
  // slow to compile.
  struct Parser;
  std::unique_ptr<Parser> parser_;
};

}  // namespace mcc::data

#endif  // DATA_JSONL_RECORD_H_
