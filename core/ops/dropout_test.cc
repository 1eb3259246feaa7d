#include "core/ops/dropout.h"

#include <cmath>
#include <vector>

#include "core/ops/test_util.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::Bytes;
using testing::RandomTensor;

// Random123's published known-answer vectors (tests/kat_vectors).
TEST(PhiloxTest, KnownAnswers) {
  using A4 = std::array<uint32_t, 4>;
  EXPECT_EQ(Philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (A4{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(Philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                          {0xffffffff, 0xffffffff}),
            (A4{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(Philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                          {0xa4093822, 0x299f31d0}),
            (A4{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// The stream's definition, one word at a time.
uint32_t Word(uint64_t seed, uint64_t w) {
  const uint64_t j = w / 4;
  return Philox4x32_10(
      {static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32), 0, 0},
      {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)})[w % 4];
}

TEST(PhiloxTest, StreamMatchesDefinitionAtAnyAlignment) {
  const uint64_t seed = 0x123456789abcdefull;
  // Offsets straddling the 2^32 boundary of the block counter, too.
  for (uint64_t first :
       {uint64_t{0}, uint64_t{3}, uint64_t{5}, (uint64_t{1} << 34) - 37}) {
    for (int64_t n : {1, 3, 31, 32, 77, 300}) {
      std::vector<uint32_t> got(n);
      PhiloxStream(seed, first, n, got.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i], Word(seed, first + i))
            << "first " << first << " n " << n << " i " << i;
      }
    }
  }
}

TEST(DropoutTest, MaskFollowsTheStreamAndScales) {
  const float p = 0.3f;
  const uint64_t seed = 42, offset = 1001;
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Tensor x = RandomTensor({7, 129}, dt, 1);
    Tensor y = Tensor::Zeros({7, 129}, dt);
    ASSERT_TRUE(Dropout(x, p, seed, offset, &y).ok());
    const std::vector<double> xv = x.ToDoubles(), yv = y.ToDoubles();
    const uint32_t thr = static_cast<uint32_t>(std::lround(p * (1 << 24)));
    for (size_t i = 0; i < xv.size(); ++i) {
      const bool keep = (Word(seed, offset + i) >> 8) >= thr;
      const double want = keep ? xv[i] / (1.0 - p) : 0.0;
      // fp32: scale by a rounded 1/(1-p), then one rounding; bf16 output:
      // one rounding to 8 significant bits, at most 2^-8 relative; fp16: 11
      // bits, 2^-11.
      const double rtol = dt == DType::kFloat32    ? 3e-7
                          : dt == DType::kBFloat16 ? 1.0 / 256
                                                   : 1.0 / 2048;
      EXPECT_NEAR(yv[i], want, std::fabs(want) * rtol) << i;
    }
  }
}

TEST(DropoutTest, KeepsAboutOneMinusP) {
  const int64_t n = 200000;
  Tensor x = Tensor::Full({n}, 1.0, DType::kFloat32);
  Tensor y = Tensor::Zeros({n}, DType::kFloat32);
  for (float p : {0.1f, 0.5f, 0.9f}) {
    ASSERT_TRUE(Dropout(x, p, 7, 0, &y).ok());
    int64_t kept = 0;
    for (double v : y.ToDoubles()) kept += v != 0.0;
    const double mean = n * (1.0 - p), sd = std::sqrt(n * p * (1.0 - p));
    EXPECT_NEAR(kept, mean, 5 * sd) << "p " << p;
  }
}

TEST(DropoutTest, BackwardUsesTheForwardMaskAndMatchesFiniteDifferences) {
  const float p = 0.25f;
  Tensor x = RandomTensor({5, 33}, DType::kFloat32, 2);
  Tensor y = Tensor::Zeros({5, 33}, DType::kFloat32);
  Tensor dy = RandomTensor({5, 33}, DType::kFloat32, 3);
  Tensor dx = Tensor::Zeros({5, 33}, DType::kFloat32);
  ASSERT_TRUE(Dropout(x, p, 9, 17, &y).ok());
  ASSERT_TRUE(DropoutBackward(dy, p, 9, 17, &dx).ok());
  // float64 forward with the same mask.
  const uint32_t thr = static_cast<uint32_t>(std::lround(p * (1 << 24)));
  auto forward = [&](const std::vector<double>& v) {
    std::vector<double> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      out[i] = (Word(9, 17 + i) >> 8) >= thr ? v[i] / (1.0 - p) : 0.0;
    }
    return out;
  };
  const std::vector<double> dyv = dy.ToDoubles();
  auto loss = [&](const std::vector<double>& v) {
    return testing::Dot(dyv, forward(v));
  };
  testing::ExpectAllNear(dx.ToDoubles(),
                         testing::NumericGrad(loss, x.ToDoubles()), 1e-6, 1e-6,
                         "dx");
  const std::vector<double> yv = y.ToDoubles(), dxv = dx.ToDoubles();
  for (size_t i = 0; i < yv.size(); ++i) EXPECT_EQ(yv[i] == 0, dxv[i] == 0);
}

TEST(DropoutTest, SlicesAndThreadCountsAgree) {
  const int64_t rows = 64, cols = 1000;  // Several parallel chunks.
  Tensor x = RandomTensor({rows, cols}, DType::kFloat32, 4);
  Tensor whole = Tensor::Zeros({rows, cols}, DType::kFloat32);
  const int threads = ThreadPool::Global().num_threads();
  ThreadPool::SetGlobalThreads(std::max(2, threads));
  ASSERT_TRUE(Dropout(x, 0.5f, 11, 5, &whole).ok());
  ThreadPool::SetGlobalThreads(1);
  Tensor serial = Tensor::Zeros({rows, cols}, DType::kFloat32);
  ASSERT_TRUE(Dropout(x, 0.5f, 11, 5, &serial).ok());
  ThreadPool::SetGlobalThreads(threads);
  EXPECT_EQ(Bytes(whole), Bytes(serial));
  // Rows [10, 13) dropped at offset 5 + 10 * cols.
  Tensor xs = x.Slice(10, 13).value();
  Tensor part = Tensor::Zeros({3, cols}, DType::kFloat32);
  ASSERT_TRUE(Dropout(xs, 0.5f, 11, 5 + 10 * cols, &part).ok());
  EXPECT_EQ(Bytes(part), Bytes(whole.Slice(10, 13).value()));
  // Another seed or offset gives another mask.
  Tensor other = Tensor::Zeros({rows, cols}, DType::kFloat32);
  ASSERT_TRUE(Dropout(x, 0.5f, 12, 5, &other).ok());
  EXPECT_NE(Bytes(other), Bytes(whole));
}

TEST(DropoutTest, BadInputs) {
  Tensor x = RandomTensor({4, 8}, DType::kFloat32, 1);
  Tensor y = RandomTensor({8, 4}, DType::kFloat32, 2);
  const auto before = Bytes(y);
  absl::Status s = Dropout(x, 0.1f, 1, 0, &y);
  EXPECT_NE(s.message().find("x fp32[4, 8] and y fp32[8, 4]"),
            std::string::npos)
      << s;
  EXPECT_EQ(Bytes(y), before);
  Tensor y2 = RandomTensor({4, 8}, DType::kFloat32, 3);
  const auto before2 = Bytes(y2);
  s = Dropout(x, 1.0f, 1, 0, &y2);
  EXPECT_NE(s.message().find("[0, 1)"), std::string::npos) << s;
  EXPECT_EQ(Bytes(y2), before2);
  Tensor cx = testing::FakeCudaTensor({4, 8}, DType::kFloat32);
  s = DropoutBackward(cx, 0.1f, 1, 0, &cx);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
}

TEST(DropoutTestDevice, MatchesCpuBitForBit) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Tensor x = RandomTensor({9, 130}, dt, 1);
    Tensor y = Tensor::Zeros({9, 130}, dt);
    testing::ExpectSameOnTestDevice({x, y}, [](std::vector<Tensor>& t) {
      return Dropout(t[0], 0.3f, 42, 1000, &t[1]);
    });
    testing::ExpectSameOnTestDevice({x, y}, [](std::vector<Tensor>& t) {
      return DropoutBackward(t[0], 0.3f, 42, 1000, &t[1]);
    });
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
