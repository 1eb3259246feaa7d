#include "data/gpt_dataset.h"

#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/barrier.h"
#include "data/test_util.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

struct Case {
  std::vector<int32_t> sizes;
  int64_t begin, end, seq, seed, num_samples;
  int epochs, separate;
  std::vector<int64_t> doc, sample, shuffle;
};

std::vector<int64_t> Ints(absl::string_view s) {
  std::vector<int64_t> out;
  for (absl::string_view w :
       absl::StrSplit(s, absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
    int64_t v;
    EXPECT_TRUE(absl::SimpleAtoi(w, &v)) << w;
    out.push_back(v);
  }
  return out;
}

// data/testdata/gpt_indices.txt, written by data/testdata/gen_numpy_fixtures.py
// with numpy 1.24's RandomState and Megatron's index algorithm.
std::vector<Case> LoadCases() {
  std::istringstream in(
      testing::ReadAll(testing::Runfile("data/testdata/gpt_indices.txt")));
  std::vector<Case> cases;
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view l = line;
    if (absl::ConsumePrefix(&l, "case ")) {
      Case c;
      for (absl::string_view kv : absl::StrSplit(l, ' ')) {
        std::pair<std::string, std::string> p = absl::StrSplit(kv, '=');
        std::vector<int64_t> v = Ints(p.second);
        if (p.first == "sizes") c.sizes.assign(v.begin(), v.end());
        if (p.first == "begin") c.begin = v[0];
        if (p.first == "end") c.end = v[0];
        if (p.first == "seq") c.seq = v[0];
        if (p.first == "seed") c.seed = v[0];
        if (p.first == "num_samples") c.num_samples = v[0];
      }
      cases.push_back(c);
    } else if (absl::ConsumePrefix(&l, "epochs ")) {
      std::vector<int64_t> v = Ints(absl::StrReplaceAll(l, {{"separate", ""}}));
      cases.back().epochs = v[0];
      cases.back().separate = v[1];
    } else if (absl::ConsumePrefix(&l, "doc ")) {
      cases.back().doc = Ints(l);
    } else if (absl::ConsumePrefix(&l, "sample ")) {
      cases.back().sample = Ints(l);
    } else if (absl::ConsumePrefix(&l, "shuffle ")) {
      cases.back().shuffle = Ints(l);
    }
  }
  return cases;
}

// A dataset whose token j of sequence i is i * 1000 + j.
std::shared_ptr<const IndexedDataset> MakeDataset(
    const std::string& prefix, const std::vector<int32_t>& sizes) {
  auto b = IndexedDatasetBuilder::Create(prefix, TokenDType::kInt32);
  EXPECT_TRUE(b.ok());
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<int32_t> t(sizes[i]);
    for (int32_t j = 0; j < sizes[i]; ++j) t[j] = i * 1000 + j;
    EXPECT_TRUE((*b)->AddDocument(t).ok());
  }
  EXPECT_TRUE((*b)->Finalize().ok());
  auto ds = IndexedDataset::Open(prefix);
  EXPECT_TRUE(ds.ok()) << ds.status();
  return std::move(ds).value();
}

TEST(GPTIndices, HandDerivedSampleIndex) {
  // Documents of 8, 3, 4 tokens in that order, samples of 4 + 1 tokens:
  // sample 0 = doc0[0..4], sample 1 = doc0[4..8) + doc1[0], sample 2 =
  // doc1[0..3) + doc2[0..2). Boundaries (position, offset): (0,0) (0,4) (1,0)
  // (2,1); (15 - 1) / 4 = 3 samples.
  const std::vector<int32_t> sizes = {3, 4, 8};
  const std::vector<int32_t> doc_index = {2, 0, 1};
  EXPECT_EQ(BuildSampleIndex(sizes, doc_index, 4, 1, 15, true),
            (std::vector<int64_t>{0, 0, 0, 4, 1, 0, 2, 1}));
}

TEST(GPTIndices, SampleIndexReportsProgressWithoutChangingIt) {
  // 3 documents of 100000 tokens, samples of 2 + 1: 149999 samples.
  const std::vector<int32_t> sizes = {100000, 100000, 100000};
  const std::vector<int32_t> doc_index = {1, 2, 0};
  std::vector<std::pair<int64_t, int64_t>> calls;
  const std::vector<int64_t> with = BuildSampleIndex(
      sizes, doc_index, 2, 1, 300000, true,
      [&](int64_t done, int64_t total) { calls.emplace_back(done, total); });
  EXPECT_EQ(with, BuildSampleIndex(sizes, doc_index, 2, 1, 300000, true));
  const std::vector<std::pair<int64_t, int64_t>> want = {
      {kIndexProgressEvery, 149999},
      {2 * kIndexProgressEvery, 149999},
      {149999, 149999}};
  EXPECT_EQ(calls, want);
}

TEST(GPTIndices, MatchMegatronWithNumpy) {
  const std::vector<Case> cases = LoadCases();
  ASSERT_EQ(cases.size(), 5u);
  for (const Case& c : cases) {
    GPTDatasetConfig config;
    config.sequence_length = c.seq;
    config.random_seed = c.seed;
    std::optional<int64_t> n;
    if (c.num_samples >= 0) n = c.num_samples;
    GPTIndices ix =
        BuildGPTIndices(c.sizes, c.begin, c.end, n, Split::kTrain, config);
    EXPECT_EQ(ix.num_epochs, c.epochs);
    EXPECT_EQ(ix.separate_final_epoch, c.separate != 0);
    EXPECT_EQ(std::vector<int64_t>(ix.document_index.begin(),
                                   ix.document_index.end()),
              c.doc);
    EXPECT_EQ(ix.sample_index, c.sample);
    EXPECT_EQ(ix.shuffle_index, c.shuffle);
  }
}

TEST(GPTDataset, SamplesAreTheDocumentStreamCutEverySeqTokens) {
  const Case c = LoadCases()[3];
  const std::string dir = testing::TempDir("gpt_samples");
  auto ds = MakeDataset(dir + "/d", c.sizes);
  GPTDatasetConfig config;
  config.sequence_length = c.seq;
  config.random_seed = c.seed;
  config.path_to_cache = "-";
  auto g = GPTDataset::Build(ds, c.begin, c.end, c.num_samples, Split::kTrain,
                             config);
  ASSERT_TRUE(g.ok()) << g.status();
  // The stream: documents in document-index order, concatenated.
  std::vector<int64_t> stream;
  for (int32_t d : (*g)->indices().document_index) {
    for (int32_t j = 0; j < c.sizes[d]; ++j) stream.push_back(d * 1000 + j);
  }
  ASSERT_GE((*g)->size(), c.num_samples);
  std::vector<int64_t> sample(c.seq + 1);
  for (int64_t i = 0; i < (*g)->size(); ++i) {
    (*g)->GetSample(i, sample.data());
    const int64_t s = (*g)->indices().shuffle_index[i];
    const std::vector<int64_t> want(stream.begin() + s * c.seq,
                                    stream.begin() + s * c.seq + c.seq + 1);
    ASSERT_EQ(sample, want) << "sample " << i;
  }
}

TEST(GPTDataset, PartialValidationSampleIsPadded) {
  const std::string dir = testing::TempDir("gpt_partial");
  auto ds = MakeDataset(dir + "/d", {5, 3, 8});
  GPTDatasetConfig config;
  config.sequence_length = 4;
  config.path_to_cache = "-";
  config.drop_last_partial_validation_sequence = false;
  auto g = GPTDataset::Build(ds, 0, 3, std::nullopt, Split::kValid, config);
  ASSERT_TRUE(g.ok()) << g.status();
  // 16 tokens: ceil(15 / 4) = 4 samples, the last holding 16 - 12 = 4 real
  // tokens and one pad.
  ASSERT_EQ((*g)->size(), 4);
  int pads = 0;
  std::vector<int64_t> s(5);
  for (int64_t i = 0; i < 4; ++i) {
    (*g)->GetSample(i, s.data());
    pads += std::count(s.begin(), s.end(), kPadTokenId);
  }
  EXPECT_EQ(pads, 1);
}

TEST(GPTDataset, CacheIsBuiltOnceAndReloaded) {
  const std::string dir = testing::TempDir("gpt_cache");
  auto ds = MakeDataset(dir + "/d", {50, 30, 80, 20, 70});
  GPTDatasetConfig config;
  config.sequence_length = 16;
  auto a = GPTDataset::Build(ds, 0, 5, 40, Split::kTrain, config);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE((*a)->built_anew());
  EXPECT_EQ((*a)->cache_prefix().rfind(dir + "/cache/GPTDataset_indices/", 0),
            0u)
      << (*a)->cache_prefix();
  EXPECT_EQ(testing::ReadAll((*a)->cache_prefix() + "-description.txt"),
            (*a)->description());
  auto b = GPTDataset::Build(ds, 0, 5, 40, Split::kTrain, config);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE((*b)->built_anew());
  EXPECT_EQ((*a)->indices().document_index, (*b)->indices().document_index);
  EXPECT_EQ((*a)->indices().sample_index, (*b)->indices().sample_index);
  EXPECT_EQ((*a)->indices().shuffle_index, (*b)->indices().shuffle_index);
  // Another seed is another cache entry.
  config.random_seed = 7;
  auto c = GPTDataset::Build(ds, 0, 5, 40, Split::kTrain, config);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE((*c)->built_anew());
  EXPECT_NE((*c)->description_hash(), (*a)->description_hash());
}

TEST(GPTDataset, RankZeroBuildsWhileOthersWait) {
  const std::string dir = testing::TempDir("gpt_ranks");
  auto ds = MakeDataset(dir + "/d", {50, 30, 80, 20, 70, 11, 90});
  GPTDatasetConfig config;
  config.sequence_length = 8;
  constexpr int kRanks = 4;
  absl::Barrier* barrier = new absl::Barrier(kRanks);
  std::vector<std::unique_ptr<GPTDataset>> got(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      RankSync sync;
      sync.rank = [r] { return r; };
      sync.barrier = [&] {
        if (barrier->Block()) delete barrier;
        return absl::OkStatus();
      };
      auto g = GPTDataset::Build(ds, 0, 7, 100, Split::kTrain, config, sync);
      ASSERT_TRUE(g.ok()) << g.status();
      got[r] = std::move(g).value();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(got[0]->built_anew());
  for (int r = 1; r < kRanks; ++r) {
    EXPECT_FALSE(got[r]->built_anew()) << "rank " << r << " rebuilt";
    EXPECT_EQ(got[r]->indices().shuffle_index, got[0]->indices().shuffle_index);
    EXPECT_EQ(got[r]->indices().sample_index, got[0]->indices().sample_index);
  }
}

TEST(GPTDataset, EmptySplitIsAnError) {
  const std::string dir = testing::TempDir("gpt_empty");
  auto ds = MakeDataset(dir + "/d", {5, 3});
  GPTDatasetConfig config;
  config.sequence_length = 4;
  auto g = GPTDataset::Build(ds, 1, 1, std::nullopt, Split::kTest, config);
  EXPECT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("test split"), std::string::npos)
      << g.status();
}

}  // namespace
}  // namespace mcc::data
