#include "training/step_flops.h"

#include <vector>

#include "core/comm/init.h"
#include "core/comm/mp_test_util.h"
#include "gtest/gtest.h"
#include "models/gpt/model_flops.h"

namespace mcc {
namespace training {
namespace {

gpt::GPTConfig Tiny() {
  gpt::GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.vocab_size = 100;
  c.seq_length = 8;
  return c;
}

data::MicroBatch WithStarts(const std::vector<int64_t>& starts, int64_t b) {
  data::MicroBatch mb;
  mb.tokens = *Tensor::FromInts(std::vector<int64_t>(b * 8, 1), {b, 8});
  mb.document_start = Tensor::Empty({b, 8}, DType::kInt32);
  for (size_t i = 0; i < starts.size(); ++i) {
    mb.document_start.data<int32_t>()[i] = static_cast<int32_t>(starts[i]);
  }
  return mb;
}

// Hand count: a token's FLOPs less the attention term (6 x 2 s h a layer =
// 12288), plus that term times the share of the 36 causal pairs a
// sequence of 8 computes.
TEST(StepFlopsCounterTest, PackedDocumentsCountTheirOwnPairs) {
  const gpt::GPTConfig c = Tiny();
  const double token = gpt::TrainingFlopsPerToken(c);
  const double attention = 12288;
  StepFlopsCounter counter(c, /*documents=*/true, nullptr);
  // Documents of 3 and 5 (21 pairs); then 5 and 3 (15 + 6), and 8 (36).
  counter.Add(WithStarts({0, 0, 0, 3, 3, 3, 3, 3}, 1));
  counter.Add(WithStarts({0, 0, 0, 0, 0, 5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0}, 2));
  auto flops = counter.TakeStepFlops(3);
  ASSERT_TRUE(flops.ok()) << flops.status();
  const double pairs = 21 + 21 + 36, full = 3 * 36;
  EXPECT_DOUBLE_EQ(*flops,
                   3 * 8 * (token - attention + attention * pairs / full));
  // The next step starts afresh: one whole document is the full count.
  counter.Add(WithStarts({0, 0, 0, 0, 0, 0, 0, 0}, 1));
  EXPECT_DOUBLE_EQ(*counter.TakeStepFlops(1), 8 * token);
}

TEST(StepFlopsCounterTest, WindowAloneAndPlainRuns) {
  gpt::GPTConfig c = Tiny();
  const double token = gpt::TrainingFlopsPerToken(c);
  // Neither: Megatron's count, unchanged.
  StepFlopsCounter plain(c, false, nullptr);
  EXPECT_EQ(*plain.TakeStepFlops(4), 4 * (token * 8));
  // A window of 2 keys back: 21 of 36 pairs in every sequence.
  c.window_left = 2;
  StepFlopsCounter window(c, false, nullptr);
  EXPECT_DOUBLE_EQ(*window.TakeStepFlops(4),
                   4 * 8 * (token - 12288 + 12288 * 21.0 / 36));
  EXPECT_NE(window.Describe().find("sliding window of 2 keys"),
            std::string::npos);
  // Documents and the window together: [0, 5) and [5, 8) under a window of
  // 1 leave 14 pairs.
  c.window_left = 1;
  StepFlopsCounter both(c, true, nullptr);
  both.Add(WithStarts({0, 0, 0, 0, 0, 5, 5, 5}, 1));
  EXPECT_DOUBLE_EQ(*both.TakeStepFlops(1),
                   8 * (token - 12288 + 12288 * 14.0 / 36));
}

// Two data-parallel ranks, different documents: each counts the step's pairs
// over both (21 + 36 of 72), not its own.
MCC_WORKER(two_dp_ranks) {
  comm::GroupOptions group_options;
  group_options.timeout = absl::Seconds(60);
  auto world = comm::InitWorldFromEnvironment(group_options);
  if (!world.ok()) {
    return comm::testing::ReportFailure("init", world.status(), 3);
  }
  const gpt::GPTConfig c = Tiny();
  StepFlopsCounter counter(c, true, world->group.get());
  counter.Add(world->group->rank() == 0
                  ? WithStarts({0, 0, 0, 3, 3, 3, 3, 3}, 1)
                  : WithStarts({0, 0, 0, 0, 0, 0, 0, 0}, 1));
  auto flops = counter.TakeStepFlops(2);
  if (!flops.ok())
    return comm::testing::ReportFailure("take", flops.status(), 3);
  const double token = gpt::TrainingFlopsPerToken(c);
  const double expected = 2 * 8 * (token - 12288 + 12288 * 57.0 / 72);
  if (*flops != expected) {
    fprintf(stderr, "rank %d: %.17g, expected %.17g\n", world->group->rank(),
            *flops, expected);
    return 4;
  }
  return 0;
}

TEST(StepFlopsCounterTest, DocumentPairsAreSummedOverDataParallelRanks) {
  auto results =
      comm::testing::RunWorkers(2, "two_dp_ranks", absl::Seconds(60));
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    EXPECT_EQ(r.exit_code, 0) << comm::testing::Describe(results);
  }
}

}  // namespace
}  // namespace training
}  // namespace mcc
