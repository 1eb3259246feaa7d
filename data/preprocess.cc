#include "data/preprocess.h"

#include <fstream>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/thread_pool.h"
#include "data/indexed_dataset.h"
#include "glog/logging.h"

namespace mcc::data {

std::string PreprocessOutputPrefix(const std::string& prefix,
                                   const std::string& key) {
  return absl::StrCat(prefix, "_", key, "_document");
}

namespace {

struct Record {
  int64_t line_no = 0;
  std::string line;
  // Per key: the ids, or an error.
  std::vector<std::vector<int32_t>> ids;
  absl::Status status;
};

// What one worker thread owns.
struct Worker {
  JsonlRecordReader reader;
  std::unique_ptr<Tokenizer> tokenizer;
};

}  // namespace

absl::Status TokenizeJsonlRecord(const PreprocessOptions& o,
                                 const std::string& path, int64_t line_no,
                                 absl::string_view line,
                                 JsonlRecordReader& reader, Tokenizer& tok,
                                 std::vector<std::vector<int32_t>>* ids) {
  std::vector<std::optional<std::string_view>> values;
  absl::Status s = reader.Read(line, o.json_keys, &values);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ":", line_no, ": ", s.message()));
  }
  ids->assign(o.json_keys.size(), {});
  for (size_t k = 0; k < o.json_keys.size(); ++k) {
    if (!values[k].has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": missing key \"", o.json_keys[k], "\""));
    }
    const absl::string_view text(values[k]->data(), values[k]->size());
    const size_t bad = FindInvalidUtf8(text);
    if (bad != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": key \"", o.json_keys[k],
          "\" holds invalid UTF-8 at byte offset ", bad, " of its text"));
    }
    if (text.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": key \"", o.json_keys[k],
                       "\" holds an empty document"));
    }
    tok.Encode(text, &(*ids)[k]);
    if (o.append_eod) (*ids)[k].push_back(static_cast<int32_t>(tok.eod()));
  }
  return absl::OkStatus();
}

absl::StatusOr<PreprocessStats> PreprocessJsonl(
    const PreprocessOptions& o, const Tokenizer& tokenizer,
    const PreprocessProgress& progress) {
  if (o.json_keys.empty()) {
    return absl::InvalidArgumentError("--json-keys is empty");
  }
  if (o.output_prefix.empty()) {
    return absl::InvalidArgumentError("--output-prefix is empty");
  }
  std::ifstream in(o.input, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--input: cannot open ", o.input));
  }
  const int workers = std::max(1, o.workers);
  std::vector<Worker> worker_state(workers);
  for (Worker& w : worker_state) w.tokenizer = tokenizer.Clone();

  PreprocessStats stats;
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  const TokenDType dtype = OptimalTokenDType(tokenizer.vocab_size());
  for (const std::string& key : o.json_keys) {
    stats.output_prefixes.push_back(
        PreprocessOutputPrefix(o.output_prefix, key));
    auto b = IndexedDatasetBuilder::Create(stats.output_prefixes.back(), dtype);
    if (!b.ok()) return b.status();
    builders.push_back(std::move(b).value());
  }

  ThreadPool pool(workers);
  const absl::Time t0 = absl::Now();
  int64_t line_no = 0;
  const size_t kBatch = 256 * workers;
  std::vector<Record> batch(kBatch);
  bool eof = false;
  while (!eof) {
    size_t n = 0;
    while (n < kBatch) {
      Record& r = batch[n];
      if (!std::getline(in, r.line)) {
        eof = true;
        break;
      }
      ++line_no;
      stats.input_bytes += r.line.size() + 1;
      if (!r.line.empty() && r.line.back() == '\r') r.line.pop_back();
      if (r.line.find_first_not_of(" \t") == std::string::npos) continue;
      r.line_no = line_no;
      ++n;
    }
    // Tokenizers are not thread-safe: split the batch into one contiguous
    // slice per worker so each slice uses its own instance.
    pool.ParallelFor(workers, 1, [&](int64_t wb, int64_t we) {
      for (int64_t w = wb; w < we; ++w) {
        const size_t lo = n * w / workers, hi = n * (w + 1) / workers;
        for (size_t i = lo; i < hi; ++i) {
          Record& r = batch[i];
          Worker& state = worker_state[w];
          r.status =
              TokenizeJsonlRecord(o, o.input, r.line_no, r.line, state.reader,
                                  *state.tokenizer, &r.ids);
        }
      }
    });
    for (size_t i = 0; i < n; ++i) {
      Record& r = batch[i];
      if (!r.status.ok()) {
        if (!o.skip_bad_records) {
          return absl::Status(r.status.code(),
                              absl::StrCat(r.status.message(),
                                           " (pass --skip-bad-records to skip "
                                           "and count such records)"));
        }
        ++stats.skipped;
        if (stats.skipped <= 10)
          LOG(WARNING) << "skipped: " << r.status.message();
        continue;
      }
      for (size_t k = 0; k < builders.size(); ++k) {
        absl::Status s = builders[k]->AddDocument(r.ids[k]);
        if (!s.ok()) return s;
        stats.tokens += r.ids[k].size();
      }
      ++stats.documents;
    }
    if (progress) {
      stats.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
      progress(stats);
    }
  }
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("--input: read error in ", o.input,
                                            " after line ", line_no));
  }
  for (auto& b : builders) {
    absl::Status s = b->Finalize();
    if (!s.ok()) return s;
  }
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  return stats;
}

}  // namespace mcc::data
