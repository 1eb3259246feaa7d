#include "core/progress_meter.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace mcc {
namespace {

void WriteToStderr(absl::string_view text) {
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

// "1h02m03s", "4m05s", "6s": whole seconds are all an ETA can promise.
std::string Eta(double seconds) {
  const int64_t s = static_cast<int64_t>(std::ceil(seconds));
  if (s >= 3600) {
    return absl::StrFormat("%dh%02dm%02ds", s / 3600, s / 60 % 60, s % 60);
  }
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

}  // namespace

bool ProgressMeter::IsTerminal(std::FILE* stream) {
  return isatty(fileno(stream)) == 1;
}

ProgressMeter::ProgressMeter(Options options) : o_(std::move(options)) {
  if (!o_.write) o_.write = WriteToStderr;
  if (!o_.write_summary) o_.write_summary = o_.write;
  start_ = o_.now();
  last_draw_ = start_;
  next_log_ = o_.log_every;
}

std::string ProgressMeter::ProgressText(int64_t items, int64_t bytes,
                                        absl::Duration elapsed) const {
  const double sec = std::max(absl::ToDoubleSeconds(elapsed), 1e-9);
  std::string text = absl::StrCat(o_.label, ": ", items, " ", o_.unit);
  if (o_.total_items > 0) absl::StrAppend(&text, "/", o_.total_items);
  double fraction = -1;
  if (o_.total_bytes > 0) {
    fraction = static_cast<double>(bytes) / o_.total_bytes;
    absl::StrAppend(&text, absl::StrFormat(", %.1f/%.1f MB", bytes / 1e6,
                                           o_.total_bytes / 1e6));
  } else if (bytes > 0) {
    absl::StrAppend(&text, absl::StrFormat(", %.1f MB", bytes / 1e6));
  }
  if (fraction < 0 && o_.total_items > 0) {
    fraction = static_cast<double>(items) / o_.total_items;
  }
  if (fraction >= 0) {
    absl::StrAppend(&text, absl::StrFormat(" (%.1f%%)", 100 * fraction));
  }
  absl::StrAppend(&text, absl::StrFormat(", %.1f %s/s", items / sec, o_.unit));
  if (bytes > 0)
    absl::StrAppend(&text, absl::StrFormat(", %.2f MB/s", bytes / 1e6 / sec));
  if (fraction > 0 && fraction <= 1) {
    absl::StrAppend(&text, ", ETA ", Eta(sec * (1 - fraction) / fraction));
  }
  return text;
}

std::string ProgressMeter::SummaryText(int64_t items, int64_t bytes,
                                       absl::Duration elapsed) const {
  const double raw = absl::ToDoubleSeconds(elapsed);
  const double sec = std::max(raw, 1e-9);
  std::string text = absl::StrCat(o_.label, ": ", items, " ", o_.unit);
  if (bytes > 0)
    absl::StrAppend(&text, absl::StrFormat(", %.2f MB", bytes / 1e6));
  absl::StrAppend(&text, absl::StrFormat(" in %.2f s: %.1f %s/s", raw,
                                         items / sec, o_.unit));
  if (bytes > 0)
    absl::StrAppend(&text, absl::StrFormat(", %.2f MB/s", bytes / 1e6 / sec));
  return text;
}

void ProgressMeter::Update(int64_t items, int64_t bytes) {
  if (finished_) return;
  if (!o_.terminal) {
    if (o_.log_every <= 0 || items < next_log_) return;
    next_log_ = items + o_.log_every;
    o_.write(ProgressText(items, bytes, o_.now() - start_) + "\n");
    return;
  }
  const absl::Time now = o_.now();
  if (now - last_draw_ < o_.refresh) return;
  last_draw_ = now;
  std::string line = ProgressText(items, bytes, now - start_);
  const size_t width = line.size();
  // Blank what is left of a longer previous line.
  if (width < drawn_width_) line.append(drawn_width_ - width, ' ');
  drawn_width_ = width;
  o_.write("\r" + line);
}

void ProgressMeter::Finish(int64_t items, int64_t bytes,
                           absl::string_view detail) {
  if (finished_) return;
  finished_ = true;
  if (o_.terminal && drawn_width_ > 0) {
    // Blank the progress line; the summary starts on a clean one.
    o_.write("\r" + std::string(drawn_width_, ' ') + "\r");
  }
  o_.write_summary(
      absl::StrCat(SummaryText(items, bytes, o_.now() - start_), detail, "\n"));
}

}  // namespace mcc
