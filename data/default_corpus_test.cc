#include "data/default_corpus.h"

#include <filesystem>

#include "data/indexed_dataset.h"
#include "data/test_util.h"
#include "data/tokenizer.h"
#include "gtest/gtest.h"

namespace mcc::data {
namespace {

TEST(DefaultCorpus, IsRealTextAndRoundTrips) {
  if (!std::filesystem::is_directory(kFortunesDir)) {
    GTEST_SKIP() << kFortunesDir << " missing: install the Debian package "
                 << "`fortunes` (tools/bazel does)";
  }
  auto docs = LoadDefaultCorpusDocuments();
  ASSERT_TRUE(docs.ok()) << docs.status();
  int64_t bytes = 0;
  for (const auto& d : *docs) bytes += d.size();
  EXPECT_GT(docs->size(), 5000u);
  EXPECT_GT(bytes, 1000000);
  const std::string dir = testing::TempDir("corpus");
  auto prefix = EnsureDefaultCorpus(dir);
  ASSERT_TRUE(prefix.ok()) << prefix.status();
  auto ds = IndexedDataset::Open(*prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_documents(), static_cast<int64_t>(docs->size()));
  EXPECT_EQ((*ds)->num_tokens(), bytes + static_cast<int64_t>(docs->size()));
  auto tok = MakeByteTokenizer();
  for (int64_t i :
       {int64_t{0}, (*ds)->num_documents() / 2, (*ds)->num_documents() - 1}) {
    std::vector<int64_t> ids = (*ds)->Get(i);
    ASSERT_EQ(ids.back(), 256);
    ids.pop_back();
    EXPECT_EQ(*tok->Decode(ids), (*docs)[i]);
  }
  // A second call finds it.
  auto again = EnsureDefaultCorpus(dir);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *prefix);
}

}  // namespace
}  // namespace mcc::data
