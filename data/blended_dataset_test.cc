#include "data/blended_dataset.h"

#include <cmath>

#include "data/test_util.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

TEST(Blending, HandDerivedOrder) {
  // Weights 0.3/0.7: at sample i (i >= 1; 1 for i = 0) pick the larger of
  // 0.3 i - taken0 and 0.7 i - taken1, ties to dataset 0. Worked by hand:
  // i=0: 0.3 vs 0.7 -> 1; i=1: 0.3 vs -0.3 -> 0; i=2: -0.4 vs 0.4 -> 1;
  // i=3: -0.1 vs 0.1 -> 1; i=4: 0.2 vs -0.2 -> 0; i=5 -> 1; i=6 -> 1;
  // i=7: 0.1 vs -0.1 -> 0; i=8 -> 1; i=9 -> 1.
  std::vector<int16_t> which;
  std::vector<int64_t> nth;
  BuildBlendingIndices(std::vector<double>{0.3, 0.7}, 10, &which, &nth);
  EXPECT_EQ(which, (std::vector<int16_t>{1, 0, 1, 1, 0, 1, 1, 0, 1, 1}));
  EXPECT_EQ(nth, (std::vector<int64_t>{0, 0, 1, 2, 1, 3, 4, 2, 5, 6}));
}

TEST(Blending, EveryPrefixStaysWithinOneSampleOfItsWeight) {
  const std::vector<double> w = {0.2, 0.5, 0.3};
  std::vector<int16_t> which;
  std::vector<int64_t> nth;
  BuildBlendingIndices(w, 5000, &which, &nth);
  std::vector<int64_t> count(3, 0);
  for (int64_t i = 0; i < 5000; ++i) {
    ASSERT_EQ(nth[i], count[which[i]]);
    ++count[which[i]];
    for (int d = 0; d < 3; ++d) {
      ASSERT_LE(std::abs(count[d] - w[d] * (i + 1)), 1.0 + 1e-9);
    }
  }
}

TEST(ParseDataPath, Forms) {
  auto one = ParseDataPath("corpus_text_document");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->prefixes, std::vector<std::string>{"corpus_text_document"});
  EXPECT_TRUE(one->weights.empty());
  auto two = ParseDataPath("0.3 prefixA 0.7 prefixB");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->prefixes, (std::vector<std::string>{"prefixA", "prefixB"}));
  EXPECT_EQ(two->weights, (std::vector<double>{0.3, 0.7}));
  EXPECT_FALSE(ParseDataPath("0.3 prefixA 0.7").ok());
  EXPECT_FALSE(ParseDataPath("0.3 a -1 b").ok());
}

TEST(ParseSplit, MegatronDefault) {
  auto m = ParseSplit("949,50,1");
  ASSERT_TRUE(m.ok());
  EXPECT_DOUBLE_EQ((*m)[0]->second, 0.949);
  EXPECT_DOUBLE_EQ((*m)[1]->first, 0.949);
  EXPECT_DOUBLE_EQ((*m)[2]->second, 1.0);
  // 1000 sequences: [0, 949), [949, 999), [999, 1000).
  EXPECT_EQ(SplitRange(*(*m)[0], 1000), (std::pair<int64_t, int64_t>(0, 949)));
  EXPECT_EQ(SplitRange(*(*m)[1], 1000),
            (std::pair<int64_t, int64_t>(949, 999)));
  EXPECT_EQ(SplitRange(*(*m)[2], 1000),
            (std::pair<int64_t, int64_t>(999, 1000)));
  auto t = ParseSplit("100,0,0");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)[1].has_value());
  EXPECT_FALSE(ParseSplit("a,b").ok());
}

void MakeDataset(const std::string& prefix, int docs, int base) {
  auto b = IndexedDatasetBuilder::Create(prefix, TokenDType::kInt32);
  ASSERT_TRUE(b.ok());
  for (int i = 0; i < docs; ++i) {
    std::vector<int32_t> t(7 + i % 5, base + i);
    ASSERT_TRUE((*b)->AddDocument(t).ok());
  }
  ASSERT_TRUE((*b)->Finalize().ok());
}

TEST(BuildGPTDatasets, WeightedBlendDrawsFromBothPrefixes) {
  const std::string dir = testing::TempDir("blend");
  MakeDataset(dir + "/a", 200, 100000);
  MakeDataset(dir + "/b", 300, 200000);
  auto blend = ParseDataPath("0.3 " + dir + "/a 0.7 " + dir + "/b");
  ASSERT_TRUE(blend.ok());
  GPTDatasetConfig config;
  config.sequence_length = 8;
  auto sets = BuildGPTDatasets(*blend, "949,50,1", {100, 10, 2}, config);
  ASSERT_TRUE(sets.ok()) << sets.status();
  // Sizes: ceil(100 * 0.3) + ceil(100 * 0.7) = 100.
  ASSERT_NE((*sets)[0], nullptr);
  EXPECT_EQ((*sets)[0]->size(), 100);
  EXPECT_EQ((*sets)[1]->size(), 10);
  int from_a = 0;
  std::vector<int64_t> s(9);
  for (int64_t i = 0; i < 100; ++i) {
    (*sets)[0]->GetSample(i, s.data());
    if (s[0] < 200000) ++from_a;
  }
  EXPECT_EQ(from_a, 30);
}

TEST(BuildGPTDatasets, MissingPrefixIsNamed) {
  auto blend = ParseDataPath("/nonexistent/prefix");
  ASSERT_TRUE(blend.ok());
  GPTDatasetConfig config;
  auto sets = BuildGPTDatasets(*blend, "949,50,1", {10, 1, 1}, config);
  EXPECT_FALSE(sets.ok());
  EXPECT_NE(sets.status().message().find("/nonexistent/prefix.idx"),
            std::string::npos);
}

// Tokens are odd exactly where the companion's mask is 1, so every sample's
// mask must line up with its tokens, across document boundaries and in
// Megatron's shuffled order.
TEST(BuildGPTDatasets, LossMaskCompanionFollowsTheTokens) {
  const std::string dir = testing::TempDir("sft_mask");
  auto tokens = IndexedDatasetBuilder::Create(dir + "/c", TokenDType::kInt32);
  auto mask = IndexedDatasetBuilder::Create(LossMaskPrefix(dir + "/c"),
                                            TokenDType::kUInt8);
  ASSERT_TRUE(tokens.ok() && mask.ok());
  for (int d = 0; d < 50; ++d) {
    std::vector<int32_t> t, m;
    for (int i = 0; i < 5 + d % 7; ++i) {
      const bool train = (i + d) % 3 == 0;
      t.push_back(2 * (d * 16 + i) + (train ? 1 : 0));
      m.push_back(train ? 1 : 0);
    }
    ASSERT_TRUE((*tokens)->AddDocument(t).ok());
    ASSERT_TRUE((*mask)->AddDocument(m).ok());
  }
  ASSERT_TRUE((*tokens)->Finalize().ok());
  ASSERT_TRUE((*mask)->Finalize().ok());
  GPTDatasetConfig config;
  config.sequence_length = 8;
  config.loss_mask = true;
  auto blend = ParseDataPath(dir + "/c");
  ASSERT_TRUE(blend.ok());
  auto sets = BuildGPTDatasets(*blend, "90,10,0", {40, 4, 0}, config);
  ASSERT_TRUE(sets.ok()) << sets.status();
  const SampleDataset& train = *(*sets)[0];
  ASSERT_TRUE(train.has_loss_mask());
  std::vector<int64_t> s(9), m(9);
  int64_t ones = 0;
  for (int64_t i = 0; i < train.size(); ++i) {
    train.GetSample(i, s.data());
    train.GetLossMask(i, m.data());
    for (int j = 0; j < 9; ++j) {
      ASSERT_EQ(m[j], s[j] % 2) << "sample " << i << " token " << j;
      ones += m[j];
    }
  }
  EXPECT_GT(ones, 0);
  // Without --sft's mode the companion is not read.
  config.loss_mask = false;
  auto plain = BuildGPTDatasets(*blend, "90,10,0", {40, 4, 0}, config);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)[0]->has_loss_mask());
  // A prefix without its companion is named.
  MakeDataset(dir + "/bare", 20, 0);
  config.loss_mask = true;
  auto bare = BuildGPTDatasets(*ParseDataPath(dir + "/bare"), "100,0,0",
                               {10, 0, 0}, config);
  ASSERT_FALSE(bare.ok());
  EXPECT_NE(bare.status().message().find("bare_loss_mask.idx"),
            std::string::npos)
      << bare.status();
}

}  // namespace
}  // namespace mcc::data
