#include "core/progress_meter.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace mcc {
namespace {

// A meter on a fake clock that records what it writes.
struct Recorder {
  absl::Time now = absl::UnixEpoch();
  std::vector<std::string> progress, summary;

  ProgressMeter::Options Options(bool terminal) {
    ProgressMeter::Options o;
    o.label = "preprocess_data";
    o.unit = "documents";
    o.total_bytes = 8'000'000;
    o.terminal = terminal;
    o.write = [this](absl::string_view s) { progress.emplace_back(s); };
    o.write_summary = [this](absl::string_view s) { summary.emplace_back(s); };
    o.now = [this] { return now; };
    return o;
  }
};

TEST(ProgressMeter, OffATerminalWritesOneSummaryLineOnly) {
  Recorder r;
  ProgressMeter meter(r.Options(/*terminal=*/false));
  for (int i = 1; i <= 100; ++i) {
    r.now += absl::Milliseconds(40);
    meter.Update(i * 10, i * 80'000);
  }
  meter.Finish(1000, 8'000'000, " -> out.{bin,idx}");
  meter.Finish(1000, 8'000'000);  // A second call writes nothing.
  EXPECT_TRUE(r.progress.empty());
  ASSERT_EQ(r.summary.size(), 1u);
  // 1000 documents and 8 MB in 4 s.
  EXPECT_EQ(r.summary[0],
            "preprocess_data: 1000 documents, 8.00 MB in 4.00 s: 250.0 "
            "documents/s, 2.00 MB/s -> out.{bin,idx}\n");
}

TEST(ProgressMeter, OffATerminalLogsEveryNItemsWhenAsked) {
  Recorder r;
  ProgressMeter::Options o = r.Options(false);
  o.log_every = 300;
  ProgressMeter meter(o);
  for (int i = 1; i <= 10; ++i) meter.Update(i * 100, 0);
  ASSERT_EQ(r.progress.size(), 3u);  // At 300, 600 and 900.
  for (const std::string& line : r.progress) {
    EXPECT_EQ(line.find('\r'), std::string::npos) << line;
    EXPECT_EQ(line.back(), '\n') << line;
  }
}

TEST(ProgressMeter, OnATerminalRedrawsInPlaceAtMostPerRefresh) {
  Recorder r;
  ProgressMeter meter(r.Options(/*terminal=*/true));
  // 10 updates a second for 2 s: at most 4 lines a second (refresh 250 ms).
  for (int i = 1; i <= 20; ++i) {
    r.now += absl::Milliseconds(100);
    meter.Update(i * 50, i * 200'000);
  }
  EXPECT_GE(r.progress.size(), 6u);
  EXPECT_LE(r.progress.size(), 8u);
  for (const std::string& line : r.progress) {
    EXPECT_EQ(line[0], '\r') << line;
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  }
  // The last drawn, at 1.8 s: 900 documents, 3.6 of 8 MB; the other 4.4 MB
  // at 2 MB/s take 2.2 s, shown rounded up.
  EXPECT_EQ(r.progress.back(),
            "\rpreprocess_data: 900 documents, 3.6/8.0 MB (45.0%), 500.0 "
            "documents/s, 2.00 MB/s, ETA 3s");
  meter.Finish(2000, 8'000'000);
  // The progress line is blanked before the summary.
  EXPECT_EQ(r.progress.back().front(), '\r');
  EXPECT_EQ(r.progress.back().find_first_not_of(" \r"), std::string::npos);
  ASSERT_EQ(r.summary.size(), 1u);
}

TEST(ProgressMeter, EtaFromItemsWhenNoBytesAndLongDurations) {
  Recorder r;
  ProgressMeter::Options o = r.Options(true);
  o.unit = "samples";
  o.total_bytes = 0;
  o.total_items = 4000;
  ProgressMeter meter(o);
  // 1000 of 4000 samples in 1230 s: 3690 s to go.
  EXPECT_EQ(meter.ProgressText(1000, 0, absl::Seconds(1230)),
            "preprocess_data: 1000 samples/4000 (25.0%), 0.8 samples/s, ETA "
            "1h01m30s");
}

}  // namespace
}  // namespace mcc
