#ifndef CORE_PROGRESS_METER_H_
#define CORE_PROGRESS_METER_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace mcc {

// Progress of a long job (preprocess_data, building GPT indices). On a
// terminal it redraws one line in place with '\r', at most once per
// `refresh`:
//   preprocess_data: 120000 documents, 512.3/2100.0 MB (24.4%),
//   41000.0 documents/s, 17.10 MB/s, ETA 1m33s
// Off a terminal (a log file, a pipe) it prints no such line, only a plain
// one every `log_every` items if asked. Finish() prints one summary line in
// both cases (on a terminal, over the progress line):
//   preprocess_data: 480000 documents, 2100.00 MB in 123.4 s:
//   3889.8 documents/s, 17.02 MB/s
//
// Not thread-safe: one thread reports. Bytes are optional (pass 0).
class ProgressMeter {
 public:
  struct Options {
    std::string label;           // "preprocess_data"
    std::string unit = "items";  // "documents", "samples"
    int64_t total_items = 0;     // 0: unknown
    int64_t total_bytes = 0;     // 0: unknown; ETA from bytes if known
    bool terminal = false;       // Draw the '\r' line (IsTerminal()).
    int64_t log_every = 0;       // Off a terminal: a line per N items.
    absl::Duration refresh = absl::Milliseconds(250);
    // Where the progress line goes (stderr by default) and where the summary
    // line goes (the same by default).
    std::function<void(absl::string_view)> write;
    std::function<void(absl::string_view)> write_summary;
    std::function<absl::Time()> now = [] { return absl::Now(); };  // Tests.
  };

  // Whether `stream` is a terminal (isatty).
  static bool IsTerminal(std::FILE* stream);

  explicit ProgressMeter(Options options);
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  // Progress so far (running totals, not increments). Cheap enough to call
  // per batch: one clock read unless a line is due.
  void Update(int64_t items, int64_t bytes = 0);

  // The summary line (appending `detail`), written once; later calls write
  // nothing.
  void Finish(int64_t items, int64_t bytes = 0, absl::string_view detail = "");

  // The texts, without '\r' or '\n' (for tests and callers' own logging).
  std::string ProgressText(int64_t items, int64_t bytes,
                           absl::Duration elapsed) const;
  std::string SummaryText(int64_t items, int64_t bytes,
                          absl::Duration elapsed) const;

 private:
  Options o_;
  absl::Time start_;
  absl::Time last_draw_;
  int64_t next_log_;
  size_t drawn_width_ = 0;  // Of the last '\r' line, to blank its tail.
  bool finished_ = false;
};

}  // namespace mcc

#endif  // CORE_PROGRESS_METER_H_
