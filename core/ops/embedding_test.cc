#include "core/ops/embedding.h"

#include <vector>

#include "core/ops/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::Bytes;
using testing::RandomTensor;

TEST(EmbeddingTest, LookupMatchesTableRows) {
  const int64_t vocab = 33, hidden = 129;
  const std::vector<int64_t> idv = {0, 5, 32, 5, 7, 1};
  for (DType id_dt : {DType::kInt32, DType::kInt64}) {
    for (DType td : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (DType od : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
        Tensor ids = Tensor::FromInts(idv, {2, 3}, id_dt).value();
        Tensor table = RandomTensor({vocab, hidden}, td, 1);
        Tensor out = Tensor::Zeros({2, 3, hidden}, od);
        ASSERT_TRUE(EmbeddingLookup(ids, table, &out).ok());
        const std::vector<double> t = table.ToDoubles(), o = out.ToDoubles();
        for (size_t r = 0; r < idv.size(); ++r) {
          for (int64_t j = 0; j < hidden; ++j) {
            // Exact, except one rounding for fp32 -> bf16 or fp16 (bf16
            // values of this range are exact in fp16).
            const double want = t[idv[r] * hidden + j];
            EXPECT_NEAR(o[r * hidden + j], want, std::fabs(want) / 256);
            if (td == od) {
              EXPECT_EQ(o[r * hidden + j], want);
            }
          }
        }
      }
    }
  }
}

TEST(EmbeddingTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int64_t vocab = 7, hidden = 5;
  const std::vector<int64_t> idv = {3, 1, 3, 6, 3, 0, 1};  // Repeats.
  Tensor ids = Tensor::FromInts(idv, {7}, DType::kInt32).value();
  for (DType gd : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Tensor dout = RandomTensor({7, hidden}, gd, 2);
    Tensor dtable = RandomTensor({vocab, hidden}, DType::kFloat32, 3);
    const std::vector<double> d0 = dtable.ToDoubles(), g = dout.ToDoubles();
    ASSERT_TRUE(EmbeddingBackward(ids, dout, &dtable).ok());
    auto loss = [&](const std::vector<double>& table) {
      double s = 0;
      for (size_t r = 0; r < idv.size(); ++r) {
        for (int64_t j = 0; j < hidden; ++j) {
          s += g[r * hidden + j] * table[idv[r] * hidden + j];
        }
      }
      return s;
    };
    std::vector<double> want =
        testing::NumericGrad(loss, std::vector<double>(vocab * hidden, 0.5));
    for (size_t i = 0; i < want.size(); ++i) want[i] += d0[i];
    testing::ExpectAllNear(dtable.ToDoubles(), want, 1e-6, 1e-6, "dtable");
  }
}

TEST(EmbeddingTest, LargeBackwardIsDeterministic) {
  const int64_t vocab = 50, hidden = 1000, tokens = 300;
  std::vector<int64_t> idv(tokens);
  for (int64_t i = 0; i < tokens; ++i) idv[i] = (i * 7) % vocab;
  Tensor ids = Tensor::FromInts(idv, {tokens}).value();
  Tensor dout = RandomTensor({tokens, hidden}, DType::kFloat32, 4);
  Tensor a = Tensor::Zeros({vocab, hidden}, DType::kFloat32);
  Tensor b = Tensor::Zeros({vocab, hidden}, DType::kFloat32);
  ASSERT_TRUE(EmbeddingBackward(ids, dout, &a).ok());
  ASSERT_TRUE(EmbeddingBackward(ids, dout, &b).ok());
  EXPECT_EQ(Bytes(a), Bytes(b));
  // Against a serial float64 sum in token order.
  const std::vector<double> g = dout.ToDoubles();
  std::vector<double> want(vocab * hidden, 0.0);
  for (int64_t r = 0; r < tokens; ++r) {
    for (int64_t j = 0; j < hidden; ++j)
      want[idv[r] * hidden + j] += g[r * hidden + j];
  }
  testing::ExpectAllNear(a.ToDoubles(), want, 1e-5, 1e-5, "dtable");
}

TEST(EmbeddingTest, VocabShardMasksOutsideIds) {
  const int64_t hidden = 4;
  Tensor table = RandomTensor({5, hidden}, DType::kFloat32, 5);  // ids 10..14
  Tensor ids = Tensor::FromInts({9, 10, 14, 15}, {4}).value();
  Tensor out = RandomTensor({4, hidden}, DType::kFloat32, 6);
  EmbeddingShard shard{10, true};
  ASSERT_TRUE(EmbeddingLookup(ids, table, &out, shard).ok());
  const std::vector<double> o = out.ToDoubles(), t = table.ToDoubles();
  for (int64_t j = 0; j < hidden; ++j) {
    EXPECT_EQ(o[0 * hidden + j], 0.0);
    EXPECT_EQ(o[1 * hidden + j], t[0 * hidden + j]);
    EXPECT_EQ(o[2 * hidden + j], t[4 * hidden + j]);
    EXPECT_EQ(o[3 * hidden + j], 0.0);
  }
  Tensor dtable = Tensor::Zeros({5, hidden}, DType::kFloat32);
  Tensor dout = Tensor::Full({4, hidden}, 1.0, DType::kFloat32);
  ASSERT_TRUE(EmbeddingBackward(ids, dout, &dtable, shard).ok());
  Tensor want = Tensor::Zeros({5, hidden}, DType::kFloat32);
  for (int64_t j = 0; j < hidden; ++j) {
    want.data<float>()[0 * hidden + j] = 1;
    want.data<float>()[4 * hidden + j] = 1;
  }
  EXPECT_EQ(dtable.ToDoubles(), want.ToDoubles());
}

TEST(EmbeddingTest, OutOfRangeIdIsNamedAndNothingIsWritten) {
  Tensor table = RandomTensor({10, 4}, DType::kFloat32, 7);
  Tensor ids = Tensor::FromInts({1, 2, 3, 4, 12, 5}, {2, 3}).value();
  Tensor out = RandomTensor({2, 3, 4}, DType::kFloat32, 8);
  const auto before = Bytes(out);
  absl::Status s = EmbeddingLookup(ids, table, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("id 12 at position [1, 1]"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("of size 10"), std::string::npos) << s;
  EXPECT_EQ(Bytes(out), before);
  Tensor dtable = RandomTensor({10, 4}, DType::kFloat32, 9);
  const auto before_dt = Bytes(dtable);
  s = EmbeddingBackward(ids, out, &dtable);
  EXPECT_NE(s.message().find("id 12 at position [1, 1]"), std::string::npos)
      << s;
  EXPECT_EQ(Bytes(dtable), before_dt);
  Tensor neg = Tensor::FromInts({-1}, {1}, DType::kInt32).value();
  Tensor out1 = Tensor::Zeros({1, 4}, DType::kFloat32);
  s = EmbeddingLookup(neg, table, &out1);
  EXPECT_NE(s.message().find("id -1 at position [0]"), std::string::npos) << s;
}

TEST(EmbeddingTest, BadShapesNameBothTensors) {
  Tensor table = RandomTensor({10, 4}, DType::kFloat32, 7);
  Tensor ids = Tensor::FromInts({1, 2, 3}, {3}).value();
  Tensor out = RandomTensor({3, 5}, DType::kFloat32, 8);
  const auto before = Bytes(out);
  absl::Status s = EmbeddingLookup(ids, table, &out);
  EXPECT_NE(s.message().find("ids int64[3] and table fp32[10, 4]"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("out fp32[3, 5] should be [3, 4]"),
            std::string::npos)
      << s;
  EXPECT_EQ(Bytes(out), before);
  Tensor fids = Tensor::Zeros({3}, DType::kFloat32);
  s = EmbeddingLookup(fids, table, &out);
  EXPECT_NE(s.message().find("ids fp32[3] must be int32 or int64"),
            std::string::npos)
      << s;
}

TEST(EmbeddingTestDevice, MatchesCpuBitForBit) {
  Tensor ids = *Tensor::FromInts({3, 0, 7, 3, 12, 9}, {2, 3});
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Tensor table = RandomTensor({10, 16}, dt, 1);
    Tensor out = Tensor::Zeros({2, 3, 16}, dt);
    EmbeddingShard shard;
    shard.vocab_start = 2;
    shard.mask_outside = true;
    testing::ExpectSameOnTestDevice(
        {ids, table, out}, [&](std::vector<Tensor>& t) {
          return EmbeddingLookup(t[0], t[1], &t[2], shard);
        });
    Tensor dout = RandomTensor({2, 3, 16}, dt, 2);
    Tensor dtable = RandomTensor({10, 16}, DType::kFloat32, 3);
    testing::ExpectSameOnTestDevice(
        {ids, dout, dtable}, [&](std::vector<Tensor>& t) {
          return EmbeddingBackward(t[0], t[1], &t[2], shard);
        });
    // An id out of range is the same error on both, and nothing is written.
    testing::ExpectSameOnTestDevice({ids, table, out},
                                    [](std::vector<Tensor>& t) {
                                      return EmbeddingLookup(t[0], t[1], &t[2]);
                                    });
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
