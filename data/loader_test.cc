#include "data/loader.h"

#include <set>

#include "gtest/gtest.h"

namespace mcc::data {
namespace {

// Sample i is the tokens i*100 .. i*100+seq, with token 7 as an "eod" at
// position 2 of every sample.
class FakeDataset : public SampleDataset {
 public:
  FakeDataset(int64_t n, int64_t seq) : n_(n), seq_(seq) {}
  int64_t size() const override { return n_; }
  int64_t sequence_length() const override { return seq_; }
  void GetSample(int64_t idx, int64_t* out) const override {
    for (int64_t i = 0; i <= seq_; ++i) out[i] = idx * 100 + i + 10;
    out[2] = 7;
  }

 private:
  int64_t n_, seq_;
};

int64_t SampleOf(const MicroBatch& mb, int64_t row, int64_t seq) {
  return (mb.tokens.data<int64_t>()[row * seq] - 10) / 100;
}

TEST(DataLoader, DataParallelRanksAreDisjointAndCoverTheData) {
  auto ds = std::make_shared<FakeDataset>(103, 6);
  std::set<int64_t> seen;
  for (int r = 0; r < 4; ++r) {
    LoaderConfig c;
    c.micro_batch_size = 2;
    c.dp_rank = r;
    c.dp_size = 4;
    auto l = DataLoader::Create(ds, c);
    ASSERT_TRUE(l.ok());
    int steps = 0;
    while (true) {
      auto mb = (*l)->Next();
      if (!mb.ok()) {
        EXPECT_EQ(mb.status().code(), absl::StatusCode::kOutOfRange);
        break;
      }
      ++steps;
      EXPECT_EQ(mb->consumed_samples, steps * 8);
      for (int64_t row = 0; row < 2; ++row) {
        const int64_t s = SampleOf(*mb, row, 6);
        // Megatron's sampler: rank r takes [8k + 2r, 8k + 2r + 2).
        EXPECT_EQ(s, (steps - 1) * 8 + 2 * r + row);
        EXPECT_TRUE(seen.insert(s).second) << "sample " << s << " twice";
      }
    }
    EXPECT_EQ(steps, 12);  // 103 / 8, last partial global batch dropped
  }
  EXPECT_EQ(seen.size(), 96u);
}

TEST(DataLoader, ResumesExactlyAtConsumedSamples) {
  auto ds = std::make_shared<FakeDataset>(50, 4);
  LoaderConfig c;
  c.micro_batch_size = 3;
  c.dp_size = 2;
  c.dp_rank = 1;
  auto full = DataLoader::Create(ds, c);
  ASSERT_TRUE(full.ok());
  std::vector<std::vector<int64_t>> all;
  int64_t resume_at = 0;
  for (int i = 0; i < 8; ++i) {
    auto mb = (*full)->Next();
    ASSERT_TRUE(mb.ok());
    const int64_t* t = mb->tokens.data<int64_t>();
    all.emplace_back(t, t + 12);
    if (i == 2) resume_at = mb->consumed_samples;
  }
  c.consumed_samples = resume_at;
  auto resumed = DataLoader::Create(ds, c);
  ASSERT_TRUE(resumed.ok());
  for (int i = 3; i < 8; ++i) {
    auto mb = (*resumed)->Next();
    ASSERT_TRUE(mb.ok());
    const int64_t* t = mb->tokens.data<int64_t>();
    EXPECT_EQ(std::vector<int64_t>(t, t + 12), all[i]) << "micro-batch " << i;
  }
}

TEST(DataLoader, LabelsMasksAndPositions) {
  auto ds = std::make_shared<FakeDataset>(4, 5);
  LoaderConfig c;
  c.micro_batch_size = 1;
  c.eod = 7;
  c.eod_mask_loss = true;
  c.reset_position_ids = true;
  MicroBatch mb = MakeMicroBatch(*ds, 1, c);
  // Sample 1: 110 111 7 113 114 115.
  EXPECT_EQ(mb.tokens.ToDoubles(),
            (std::vector<double>{110, 111, 7, 113, 114}));
  EXPECT_EQ(mb.labels.ToDoubles(),
            (std::vector<double>{111, 7, 113, 114, 115}));
  EXPECT_EQ(mb.loss_mask.ToDoubles(), (std::vector<double>{1, 1, 0, 1, 1}));
  EXPECT_EQ(mb.position_ids.ToDoubles(), (std::vector<double>{0, 1, 2, 0, 1}));
}

TEST(DataLoader, DocumentStartsWithResetAttentionMask) {
  auto ds = std::make_shared<FakeDataset>(4, 5);
  LoaderConfig c;
  c.micro_batch_size = 1;
  c.eod = 7;
  EXPECT_FALSE(MakeMicroBatch(*ds, 1, c).document_start.defined());
  c.reset_attention_mask = true;
  MicroBatch mb = MakeMicroBatch(*ds, 1, c);
  // Sample 1: 110 111 7 | 113 114: the second document starts at 3.
  EXPECT_EQ(mb.document_start.dtype(), DType::kInt32);
  EXPECT_EQ(mb.document_start.ToDoubles(),
            (std::vector<double>{0, 0, 0, 3, 3}));
  // Positions restart only with reset_position_ids.
  EXPECT_EQ(mb.position_ids.ToDoubles(), (std::vector<double>{0, 1, 2, 3, 4}));
}

// FakeDataset whose mask trains on tokens at even positions only.
class MaskedDataset : public FakeDataset {
 public:
  using FakeDataset::FakeDataset;
  bool has_loss_mask() const override { return true; }
  void GetLossMask(int64_t idx, int64_t* out) const override {
    for (int64_t i = 0; i <= sequence_length(); ++i) out[i] = i % 2 == 0;
  }
};

TEST(DataLoader, ADatasetsLossMaskMasksTheLabels) {
  MaskedDataset ds(4, 5);
  LoaderConfig c;
  c.micro_batch_size = 1;
  MicroBatch mb = MakeMicroBatch(ds, 1, c);
  // Position i predicts token i + 1: trained where i + 1 is even.
  EXPECT_EQ(mb.loss_mask.ToDoubles(), (std::vector<double>{0, 1, 0, 1, 0}));
}

TEST(DataLoader, StagesWithoutDataReadNothing) {
  auto ds = std::make_shared<FakeDataset>(20, 4);
  LoaderConfig c;
  c.micro_batch_size = 2;
  c.needs_data = false;
  auto l = DataLoader::Create(ds, c);
  ASSERT_TRUE(l.ok());
  auto mb = (*l)->Next();
  ASSERT_TRUE(mb.ok());
  EXPECT_FALSE(mb->tokens.defined());
  EXPECT_EQ(mb->consumed_samples, 2);
}

TEST(DataLoader, BadConfigIsAnError) {
  auto ds = std::make_shared<FakeDataset>(20, 4);
  LoaderConfig c;
  c.dp_rank = 2;
  c.dp_size = 2;
  EXPECT_FALSE(DataLoader::Create(ds, c).ok());
}

}  // namespace
}  // namespace mcc::data
