#ifndef DATA_PREPROCESS_H_
#define DATA_PREPROCESS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/jsonl_record.h"
#include "data/tokenizer.h"

namespace mcc::data {

struct PreprocessOptions {
  std::string input;                           // --input file.jsonl
  std::vector<std::string> json_keys{"text"};  // --json-keys
  std::string output_prefix;                   // --output-prefix
  bool append_eod = false;                     // --append-eod
  int workers = 1;                             // --workers
  // Skip (and count) records that are not valid JSON, lack a key, hold
  // invalid UTF-8 or an empty text, instead of failing on the first one.
  bool skip_bad_records = false;
};

struct PreprocessStats;

// Called on the calling thread after each batch of records with the running
// totals (tools/preprocess_data draws its progress line from it).
using PreprocessProgress = std::function<void(const PreprocessStats&)>;

struct PreprocessStats {
  int64_t documents = 0;  // records written
  int64_t skipped = 0;    // records skipped (skip_bad_records)
  int64_t tokens = 0;
  int64_t input_bytes = 0;
  double seconds = 0;
  std::vector<std::string> output_prefixes;  // one per key
};

// Megatron's output name for a key: "<prefix>_<key>_document".
std::string PreprocessOutputPrefix(const std::string& prefix,
                                   const std::string& key);

// Tokenizes every line of a jsonl file into one Megatron indexed dataset per
// key (each record one document; with append_eod the document ends in eod).
// Errors name the file and the line (and byte offset where it applies).
// Outputs appear under their final names only when all went well.
// One jsonl line of `path` (line number line_no, for errors): the tokens of
// each of options.json_keys into (*ids)[k], with eod appended when
// options.append_eod. The record must be one JSON object whose keys hold
// non-empty, valid UTF-8 strings; otherwise the error names path:line_no.
// `reader` and `tokenizer` are the calling thread's own.
absl::Status TokenizeJsonlRecord(const PreprocessOptions& options,
                                 const std::string& path, int64_t line_no,
                                 absl::string_view line,
                                 JsonlRecordReader& reader,
                                 Tokenizer& tokenizer,
                                 std::vector<std::vector<int32_t>>* ids);

absl::StatusOr<PreprocessStats> PreprocessJsonl(
    const PreprocessOptions& options, const Tokenizer& tokenizer,
    const PreprocessProgress& progress = nullptr);

}  // namespace mcc::data

#endif  // DATA_PREPROCESS_H_
