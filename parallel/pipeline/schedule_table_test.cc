// The schedule table, its checker and its CSV reader: the tables generated
// from today's executor order run to the end with the known activation peaks,
// and bad tables or bad bytes are refused naming what is wrong.
#include "parallel/pipeline/schedule_table.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parallel/pipeline/schedule_check.h"
#include "parallel/pipeline/schedule_csv.h"
#include "parallel/pipeline/schedules.h"

namespace mcc {
namespace pipeline {
namespace {

using ::testing::HasSubstr;

ScheduleRow Row(int rank, int step, int mb, int chunk, ScheduleOp op) {
  ScheduleRow r;
  r.rank = rank;
  r.step = step;
  r.microbatch = mb;
  r.chunk = chunk;
  r.op = op;
  return r;
}
constexpr ScheduleOp F = ScheduleOp::kForward;
constexpr ScheduleOp B = ScheduleOp::kBackward;
constexpr ScheduleOp W = ScheduleOp::kWeight;

TEST(ScheduleTableTest, GeneratedRowsFollowTheExecutorOrder) {
  const ScheduleShape shape{4, 2, 8};
  auto table = GenerateScheduleTable(ScheduleKind::kInterleaved, shape);
  ASSERT_TRUE(table.ok()) << table.status();
  for (int r = 0; r < shape.ranks; ++r) {
    auto actions = BuildSchedule(ScheduleKind::kInterleaved, shape.ranks, r,
                                 shape.chunks, shape.microbatches);
    ASSERT_TRUE(actions.ok());
    std::vector<ScheduleRow> rows;
    for (const ScheduleRow& row : table->rows) {
      if (row.rank == r) rows.push_back(row);
    }
    ASSERT_EQ(rows.size(), actions->size());
    for (size_t i = 0; i < rows.size(); ++i) {
      EXPECT_EQ(rows[i].step, static_cast<int>(i));
      EXPECT_EQ(rows[i].microbatch, (*actions)[i].microbatch);
      EXPECT_EQ(rows[i].chunk, (*actions)[i].chunk);
      EXPECT_EQ(rows[i].op == F, (*actions)[i].kind == Action::kForward);
    }
  }
}

TEST(ScheduleTableTest, OneFOneBRunsWithPeakPpMinusRank) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 7, 16}) {
      auto table = GenerateScheduleTable(ScheduleKind::kOneFOneB, {p, 1, m});
      ASSERT_TRUE(table.ok()) << table.status();
      auto check = CheckSchedule(*table);
      ASSERT_TRUE(check.ok())
          << "pp " << p << " m " << m << ": " << check.status();
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(check->peak_held[r], std::min(p - r, m))
            << "pp " << p << " m " << m << " rank " << r;
      }
    }
  }
}

// ZB-H1: 1F1B's forwards and input-gradient backwards in 1F1B's order (so
// the same transfers), every rank holding at most 1F1B's busiest rank's
// min(P, m), with rank r's last W's in its cool-down rather than after
// each B: the first rank runs a W after each cool-down B.
TEST(ScheduleTableTest, ZeroBubbleH1KeepsOneFOneBOrderAndPeak) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {1, 2, 3, 4, 7, 16}) {
      auto zb = GenerateScheduleTable(ScheduleKind::kZeroBubbleH1, {p, 1, m});
      auto one = GenerateScheduleTable(ScheduleKind::kOneFOneB, {p, 1, m});
      ASSERT_TRUE(zb.ok()) << zb.status();
      ASSERT_TRUE(one.ok()) << one.status();
      auto check = CheckSchedule(*zb, std::min(p, m));
      ASSERT_TRUE(check.ok())
          << "pp " << p << " m " << m << ": " << check.status();
      for (int r = 0; r < p; ++r) {
        std::vector<std::string> zb_fb, one_fb;
        for (const ScheduleRow& row : zb->rows) {
          if (row.rank == r && row.op != ScheduleOp::kWeight) {
            zb_fb.push_back(
                ScheduleRowString({r, 0, row.microbatch, 0, row.op}));
          }
        }
        for (const ScheduleRow& row : one->rows) {
          if (row.rank == r) {
            one_fb.push_back(
                ScheduleRowString({r, 0, row.microbatch, 0, row.op}));
          }
        }
        EXPECT_EQ(zb_fb, one_fb) << "pp " << p << " m " << m << " rank " << r;
      }
      // The last rank holds P at the peak when m >= P (it defers P - 1 W's).
      if (m >= p) {
        EXPECT_EQ(check->peak_held[p - 1], p) << "pp " << p;
      }
    }
  }
  auto actions = BuildSchedule(ScheduleKind::kZeroBubbleH1, 2, 0, 1, 4);
  ASSERT_TRUE(actions.ok()) << actions.status();
  std::string order;
  for (const Action& a : *actions) order += ActionString(a) + " ";
  EXPECT_EQ(order,
            "F0.0 F1.0 B0.0 W0.0 F2.0 B1.0 W1.0 F3.0 B2.0 W2.0 B3.0 W3.0 ");
  actions = BuildSchedule(ScheduleKind::kZeroBubbleH1, 2, 1, 1, 4);
  ASSERT_TRUE(actions.ok()) << actions.status();
  order.clear();
  for (const Action& a : *actions) order += ActionString(a) + " ";
  EXPECT_EQ(order,
            "F0.0 B0.0 F1.0 B1.0 W0.0 F2.0 B2.0 W1.0 F3.0 B3.0 W2.0 W3.0 ");
}

// The idle share of each stage's order when F, B and W each take one unit
// of time (1F1B's whole backward two) and transfers are free: BuildSchedule's
// orders reach TheoreticalBubble, 1F1B's (P - 1) / (m + P - 1) and ZB-H1's
// (P - 1) / (3m + P - 1). An order that deferred W's where they do not fill
// a wait would come out longer.
double SimulatedBubble(ScheduleKind kind, int p, int m) {
  std::vector<std::vector<Action>> actions(p);
  for (int s = 0; s < p; ++s) {
    auto a = BuildSchedule(kind, p, s, 1, m);
    EXPECT_TRUE(a.ok()) << a.status();
    if (a.ok()) actions[s] = *a;
  }
  const bool split = kind == ScheduleKind::kZeroBubbleH1;
  // End time of (stage, kind, micro-batch); -1 until done.
  std::vector<std::vector<std::vector<int>>> done(
      p, std::vector<std::vector<int>>(3, std::vector<int>(m, -1)));
  std::vector<size_t> next(p, 0);
  std::vector<int> free(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (next[s] == actions[s].size()) continue;
      const Action& a = actions[s][next[s]];
      std::vector<int> deps;
      if (a.kind == Action::kForward && s > 0) {
        deps.push_back(done[s - 1][Action::kForward][a.microbatch]);
      }
      if (a.kind == Action::kBackward) {
        deps.push_back(done[s][Action::kForward][a.microbatch]);
        if (s < p - 1) {
          deps.push_back(done[s + 1][Action::kBackward][a.microbatch]);
        }
      }
      if (a.kind == Action::kWeight) {
        deps.push_back(done[s][Action::kBackward][a.microbatch]);
      }
      int start = free[s];
      bool ready = true;
      for (int d : deps) {
        ready &= d >= 0;
        start = std::max(start, d);
      }
      if (!ready) continue;
      const int length = a.kind == Action::kBackward && !split ? 2 : 1;
      free[s] = done[s][a.kind][a.microbatch] = start + length;
      ++next[s];
      progress = true;
    }
  }
  const int span = *std::max_element(free.begin(), free.end());
  return 1.0 - 3.0 * m / span;
}

TEST(ScheduleTableTest, ZeroBubbleH1ReachesItsTheoreticalBubble) {
  for (int p : {2, 3, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      for (ScheduleKind kind :
           {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1}) {
        EXPECT_NEAR(SimulatedBubble(kind, p, m),
                    TheoreticalBubble(kind, p, 1, m), 1e-12)
            << ScheduleName(kind) << " pp " << p << " m " << m;
      }
    }
  }
}

// Interleaved: rank r runs warmup_r = 2 (P - r - 1) + (V - 1) P forwards
// (every one of the m V when m = P, and at most m V) before its first
// backward, then a forward and a backward in turn, so it holds
// min(warmup_r + 1, m V) (micro-batch, chunk) pairs at the peak.
TEST(ScheduleTableTest, InterleavedRunsWithDerivedPeak) {
  for (int p : {2, 3, 4}) {
    for (int v : {2, 3}) {
      for (int m : {p, 2 * p, 4 * p}) {
        auto table =
            GenerateScheduleTable(ScheduleKind::kInterleaved, {p, v, m});
        ASSERT_TRUE(table.ok()) << table.status();
        auto check = CheckSchedule(*table);
        ASSERT_TRUE(check.ok()) << check.status();
        for (int r = 0; r < p; ++r) {
          const int total = m * v;
          const int warmup =
              m == p ? total : std::min(total, 2 * (p - r - 1) + (v - 1) * p);
          EXPECT_EQ(check->peak_held[r], std::min(warmup + 1, total))
              << "pp " << p << " v " << v << " m " << m << " rank " << r;
        }
      }
    }
  }
}

TEST(ScheduleTableTest, AllForwardAllBackwardHoldsEveryMicroBatch) {
  auto table =
      GenerateScheduleTable(ScheduleKind::kAllForwardAllBackward, {4, 1, 6});
  ASSERT_TRUE(table.ok());
  auto check = CheckSchedule(*table);
  ASSERT_TRUE(check.ok()) << check.status();
  for (int peak : check->peak_held) EXPECT_EQ(peak, 6);
}

TEST(ScheduleTableTest, PeakOverTheBoundIsRefused) {
  auto table = GenerateScheduleTable(ScheduleKind::kOneFOneB, {4, 1, 8});
  ASSERT_TRUE(table.ok());
  EXPECT_TRUE(CheckSchedule(*table, 4).ok());
  auto check = CheckSchedule(*table, 3);
  ASSERT_FALSE(check.ok());
  EXPECT_THAT(std::string(check.status().message()),
              HasSubstr("rank 0 holds 4 micro-batches' activations, over the "
                        "bound of 3"));
}

TEST(ScheduleTableTest, BackwardBeforeItsForwardIsRefused) {
  ScheduleTable t{{1, 1, 2},
                  {Row(0, 0, 0, 0, F), Row(0, 1, 1, 0, B), Row(0, 2, 1, 0, F),
                   Row(0, 3, 0, 0, B)}};
  auto check = CheckSchedule(t);
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.status().message(),
            "pipeline schedule deadlocks: rank 0 step 1: B micro-batch 1 "
            "chunk 0 waits for rank 0 step 2: F micro-batch 1 chunk 0, which "
            "cannot run first");
}

TEST(ScheduleTableTest, CycleBetweenTwoRanksIsRefused) {
  // Rank 0 waits at B0 for rank 1's B0, which sits behind rank 1's F1,
  // which waits for rank 0's F1, behind rank 0's B0.
  ScheduleTable t{{2, 1, 2},
                  {Row(0, 0, 0, 0, F), Row(0, 1, 0, 0, B), Row(0, 2, 1, 0, F),
                   Row(0, 3, 1, 0, B), Row(1, 0, 1, 0, F), Row(1, 1, 0, 0, F),
                   Row(1, 2, 0, 0, B), Row(1, 3, 1, 0, B)}};
  auto check = CheckSchedule(t);
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.status().message(),
            "pipeline schedule deadlocks: rank 0 step 1: B micro-batch 0 "
            "chunk 0 waits for rank 1 step 2: B micro-batch 0 chunk 0, which "
            "cannot run first");
}

TEST(ScheduleTableTest, MissingRowIsRefused) {
  auto table = GenerateScheduleTable(ScheduleKind::kOneFOneB, {2, 1, 3});
  ASSERT_TRUE(table.ok());
  // Drop rank 1's last row (a B): the table is short by one.
  table->rows.pop_back();
  auto check = CheckSchedule(*table);
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.status().message(),
            "pipeline schedule: missing row: rank 1 B micro-batch 2 chunk 0");
}

TEST(ScheduleTableTest, StepGapAndRepeatAreRefused) {
  ScheduleTable gap{{1, 1, 1}, {Row(0, 0, 0, 0, F), Row(0, 2, 0, 0, B)}};
  EXPECT_THAT(std::string(CheckSchedule(gap).status().message()),
              HasSubstr("rank 0 has no step 1"));
  ScheduleTable twice{
      {1, 1, 1}, {Row(0, 0, 0, 0, F), Row(0, 1, 0, 0, B), Row(0, 2, 0, 0, F)}};
  EXPECT_THAT(std::string(CheckSchedule(twice).status().message()),
              HasSubstr("rank 0 step 2: F micro-batch 0 chunk 0 repeats rank "
                        "0 step 0"));
}

TEST(ScheduleTableTest, SplitWeightGradientRunsAndHoldsUntilW) {
  // One rank, two micro-batches: F0 B0 F1 B1 W0 W1 holds both until W
  // (it would hold one if B freed the activations).
  ScheduleTable t{{1, 1, 2},
                  {Row(0, 0, 0, 0, F), Row(0, 1, 0, 0, B), Row(0, 2, 1, 0, F),
                   Row(0, 3, 1, 0, B), Row(0, 4, 0, 0, W), Row(0, 5, 1, 0, W)}};
  auto check = CheckSchedule(t);
  ASSERT_TRUE(check.ok()) << check.status();
  EXPECT_EQ(check->peak_held[0], 2);
  // W before its B.
  ScheduleTable early{
      {1, 1, 1}, {Row(0, 0, 0, 0, F), Row(0, 1, 0, 0, W), Row(0, 2, 0, 0, B)}};
  EXPECT_THAT(std::string(CheckSchedule(early).status().message()),
              HasSubstr("rank 0 step 1: W micro-batch 0 chunk 0 waits for "
                        "rank 0 step 2: B"));
  // Some W rows but not all.
  ScheduleTable partial{
      {1, 1, 2},
      {Row(0, 0, 0, 0, F), Row(0, 1, 0, 0, B), Row(0, 2, 0, 0, W),
       Row(0, 3, 1, 0, F), Row(0, 4, 1, 0, B)}};
  EXPECT_THAT(std::string(CheckSchedule(partial).status().message()),
              HasSubstr("missing row: rank 0 W micro-batch 1 chunk 0"));
}

// ZB-V: for every pipeline size and micro-batch count the V-shaped table
// runs to the end, every rank holds at most 2P (micro-batch, chunk) pairs
// (each half a 1F1B stage's layers: 1F1B's first-stage peak in bytes, and
// exactly that once the V is full), and each chunk's last W is micro-batch
// m - 1's (data parallelism reduces after it).
TEST(ScheduleTableTest, ZeroBubbleVRunsWithinOneFOneBPeak) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m <= 4 * p; ++m) {
      auto table = GenerateScheduleTable(ScheduleKind::kZeroBubbleV, {p, 2, m});
      ASSERT_TRUE(table.ok()) << table.status();
      EXPECT_TRUE(table->shape.v_shape);
      auto check = CheckSchedule(*table, 2 * std::min(p, m));
      ASSERT_TRUE(check.ok())
          << "pp " << p << " m " << m << ": " << check.status();
      if (m >= 2 * p - 1) {
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(check->peak_held[r], 2 * p) << "pp " << p << " rank " << r;
        }
      }
      for (int r = 0; r < p; ++r) {
        int last_w[2] = {-1, -1}, last_step[2] = {-1, -1};
        for (const ScheduleRow& row : table->rows) {
          if (row.rank == r && row.op == W && row.step > last_step[row.chunk]) {
            last_step[row.chunk] = row.step;
            last_w[row.chunk] = row.microbatch;
          }
        }
        EXPECT_EQ(last_w[0], m - 1);
        EXPECT_EQ(last_w[1], m - 1);
      }
    }
  }
  // The same rows read as a loop (chunk 1 of rank r as virtual stage P + r)
  // wait for forwards that never come.
  auto table = GenerateScheduleTable(ScheduleKind::kZeroBubbleV, {4, 2, 8});
  ASSERT_TRUE(table.ok());
  table->shape.v_shape = false;
  EXPECT_THAT(std::string(CheckSchedule(*table).status().message()),
              HasSubstr("deadlocks"));
}

TEST(ScheduleTableTest, ZeroBubbleVBubbleIsBelowZeroBubbleH1) {
  // With F = B = W the V's only idle time is its fill and drain; with
  // enough micro-batches it is far below ZB-H1's and 1F1B's.
  for (int p : {2, 4, 8}) {
    for (int m : {2 * p, 4 * p}) {
      const double v = TheoreticalBubble(ScheduleKind::kZeroBubbleV, p, 2, m);
      EXPECT_GE(v, 0.0);
      EXPECT_LT(v, TheoreticalBubble(ScheduleKind::kZeroBubbleH1, p, 1, m))
          << "pp " << p << " m " << m;
    }
  }
  EXPECT_EQ(TheoreticalBubble(ScheduleKind::kZeroBubbleV, 1, 2, 8), 0.0);
}

TEST(ScheduleTableTest, ZeroBubbleVNeedsTwoChunks) {
  EXPECT_THAT(
      std::string(GenerateScheduleTable(ScheduleKind::kZeroBubbleV, {4, 3, 8})
                      .status()
                      .message()),
      HasSubstr("ZB-V runs two model chunks per stage (a V), not 3"));
  EXPECT_FALSE(BuildSchedule(ScheduleKind::kZeroBubbleV, 2, 0, 1, 4).ok());
}

TEST(ScheduleCsvTest, RoundTripsGeneratedTables) {
  for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kInterleaved,
                            ScheduleKind::kZeroBubbleV}) {
    ScheduleShape shape{4, kind == ScheduleKind::kOneFOneB ? 1 : 2, 8};
    shape.v_shape = IsVShaped(kind);
    auto table = GenerateScheduleTable(kind, shape);
    ASSERT_TRUE(table.ok());
    const std::string csv = WriteScheduleCsv(*table);
    auto read = ReadScheduleCsv(csv, shape);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(WriteScheduleCsv(*read), csv);
    EXPECT_TRUE(CheckSchedule(*read).ok());
  }
}

TEST(ScheduleCsvTest, AcceptsCrLfAndBlankLines) {
  auto read = ReadScheduleCsv(
      "rank,step,microbatch,chunk,op\r\n0,0,0,0,F\r\n\r\n0,1,0,0,B\r\n",
      {1, 1, 1});
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->rows.size(), 2u);
  EXPECT_EQ(read->rows[1].line, 4);
}

std::string CsvError(const std::string& body, ScheduleShape shape = {2, 1, 2}) {
  auto read = ReadScheduleCsv(body, shape);
  EXPECT_FALSE(read.ok()) << body;
  return read.ok() ? "" : std::string(read.status().message());
}

TEST(ScheduleCsvTest, HostileBytesAreRefusedNamingTheLine) {
  const std::string h = "rank,step,microbatch,chunk,op\n";
  struct Case {
    std::string body;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"", "no header"},
      {"rank,step,op\n0,0,F\n", "line 1: expected the header"},
      {h + "0,0,0,0\n", "line 2: expected 5 fields"},
      {h + "0,0,0,0,F,\n", "line 2: expected 5 fields"},
      {h + "-1,0,0,0,F\n", "line 2: rank \"-1\" is not a non-negative"},
      {h + "0,+1,0,0,F\n", "line 2: step \"+1\" is not"},
      {h + "0, 0,0,0,F\n", "line 2: step \" 0\" is not"},
      {h + "0,0,0x1,0,F\n", "line 2: microbatch \"0x1\" is not"},
      {h + "0,0,0,,F\n", "line 2: chunk \"\" is not"},
      {h + "0,0,99999999999999999999,0,F\n", "line 2: microbatch"},
      {h + "0,0,1e3,0,F\n", "line 2: microbatch \"1e3\""},
      {h + std::string("0,0,0,0,F\0", 10) + "\n",
       "line 2: op \"F\\x00\" is not one of F, B, W"},
      {h + "0,0,0,0,f\n", "line 2: op \"f\" is not one of"},
      {h + "0,0,0,0,I\n", "line 2: op \"I\" is not one of"},
      {h + "0,0,0,0,\xff\n", "line 2: op \"\\xff\""},
      {h + "2,0,0,0,F\n", "line 2: rank 2 is not below the 2 ranks"},
      {h + "0,0,0,1,F\n", "line 2: chunk 1 is not below the 1 chunks"},
      {h + "0,0,2,0,F\n", "line 2: micro-batch 2 is not below the 2"},
      {h + "0,0,0,0,F\n0,1,0,0,F\n",
       "rank 0 step 1: F micro-batch 0 chunk 0 (line 3) repeats rank 0 "
       "step 0: F micro-batch 0 chunk 0 (line 2)"},
      {h + "0,0,0,0,F\n0,0,1,0,F\n",
       "rank 0 step 0: F micro-batch 1 chunk 0 (line 3) takes the step of "
       "rank 0 step 0: F micro-batch 0 chunk 0 (line 2)"},
      {h + "0,0,0,0,F\n", "missing row: rank 0 B micro-batch 0 chunk 0"},
      {h + "0,99,0,0,F\n", "(line 2) is out of range"},
  };
  for (const Case& c : cases) {
    EXPECT_THAT(CsvError(c.body), HasSubstr(c.message)) << c.body;
  }
}

TEST(ScheduleCsvTest, TooManyRowsAreRefusedBeforeReadingThemAll) {
  std::string body = "rank,step,microbatch,chunk,op\n";
  for (int i = 0; i < 10; ++i) body += "0,0,0,0,F\n";
  EXPECT_THAT(CsvError(body, {1, 1, 1}),
              HasSubstr("line 5: more rows than the 3 the shape allows"));
}

TEST(ScheduleCsvTest, BadShapeIsRefused) {
  EXPECT_THAT(CsvError("rank,step,microbatch,chunk,op\n", {0, 1, 1}),
              HasSubstr("each must be positive"));
  EXPECT_THAT(CsvError("rank,step,microbatch,chunk,op\n", {1024, 1024, 1024}),
              HasSubstr("at most 2^20"));
}

// Every one-byte change to a valid file either reads to a table that the
// checker judges (accepts or refuses with a message) or is refused; none
// crashes.
TEST(ScheduleCsvTest, EveryOneByteMutationIsHandled) {
  const ScheduleShape shape{2, 1, 2};
  auto table = GenerateScheduleTable(ScheduleKind::kOneFOneB, shape);
  ASSERT_TRUE(table.ok());
  const std::string csv = WriteScheduleCsv(*table);
  int refused = 0;
  for (size_t i = 0; i < csv.size(); ++i) {
    for (char c : {'0', '1', '9', ',', 'F', 'B', 'W', '\n', '\0', '-'}) {
      std::string mutated = csv;
      mutated[i] = c;
      auto read = ReadScheduleCsv(mutated, shape);
      if (!read.ok()) {
        EXPECT_FALSE(read.status().message().empty());
        ++refused;
        continue;
      }
      auto check = CheckSchedule(*read);
      if (!check.ok()) ++refused;
    }
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace pipeline
}  // namespace mcc
