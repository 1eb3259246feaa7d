#include "core/ops/rotary.h"

#include <cmath>
#include <vector>

#include "core/ops/nn_test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectClose;
using testing::NumericGrad;

// float64 reference on [b, s, h, d], written independently of the kernel as
// Megatron's y = x * cos(emb) + rotate_half(x) * sin(emb) with
// emb = cat(freqs, freqs).
std::vector<double> RopeRef(const std::vector<double>& x, int64_t b, int64_t s,
                            int64_t h, int64_t d, int64_t rd, int64_t offset,
                            double base = 10000.0) {
  std::vector<double> y = x;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t t = 0; t < s; ++t) {
      for (int64_t hh = 0; hh < h; ++hh) {
        const int64_t o = ((bi * s + t) * h + hh) * d;
        for (int64_t j = 0; j < rd; ++j) {
          const int64_t i = j % (rd / 2);
          const double freq = 1.0 / std::pow(base, (2.0 * i) / rd);
          const double emb = (t + offset) * freq;
          const double rot =
              j < rd / 2 ? -x[o + j + rd / 2] : x[o + j - rd / 2];
          y[o + j] = x[o + j] * std::cos(emb) + rot * std::sin(emb);
        }
      }
    }
  }
  return y;
}

struct RopeCase {
  int64_t b, s, h, d, rd, offset;
};

class RotaryTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RotaryTest, ForwardAndBackwardMatchFloat64) {
  const RopeCase c = GetParam();
  const Shape shape = {c.b, c.s, c.h, c.d};
  Tensor x = testing::RandomTensor(shape, DType::kFloat32, 1 + c.s * 7 + c.d);
  Tensor w = testing::RandomTensor(shape, DType::kFloat32, 2 + c.s * 7 + c.d);
  const std::vector<double> xd = x.ToDoubles(), wd = w.ToDoubles();
  RotaryOptions opt;
  opt.rotary_dim = c.rd;
  opt.position_offset = c.offset;
  const int64_t rd = c.rd == 0 ? c.d : c.rd;
  Tensor y = Tensor::Full(shape, 9.0, DType::kFloat32);
  ASSERT_TRUE(RotaryForward(x, opt, &y).ok());
  ExpectClose(y.ToDoubles(), RopeRef(xd, c.b, c.s, c.h, c.d, rd, c.offset),
              2e-6, 1e-5, "rope y");

  // d/dx sum(rope(x) * w) by central differences.
  auto loss = [&](const std::vector<double>& v) {
    const std::vector<double> yy = RopeRef(v, c.b, c.s, c.h, c.d, rd, c.offset);
    double acc = 0.0;
    for (size_t i = 0; i < yy.size(); ++i) acc += yy[i] * wd[i];
    return acc;
  };
  Tensor dx = Tensor::Full(shape, 9.0, DType::kFloat32);
  ASSERT_TRUE(RotaryBackward(w, opt, &dx).ok());
  ExpectClose(dx.ToDoubles(), NumericGrad(xd, loss), 1e-5, 1e-5, "rope dx");

  // In place gives the same as out of place.
  Tensor xi = x.Clone();
  ASSERT_TRUE(RotaryForward(xi, opt, &xi).ok());
  ExpectClose(xi.ToDoubles(), y.ToDoubles(), 0, 0, "rope in place");
}

INSTANTIATE_TEST_SUITE_P(Sizes, RotaryTest,
                         ::testing::Values(RopeCase{1, 1, 1, 8, 0, 0},
                                           RopeCase{2, 5, 3, 8, 0, 3},
                                           RopeCase{2, 5, 2, 24, 0, 0},
                                           RopeCase{1, 67, 2, 24, 8, 0},
                                           RopeCase{2, 67, 1, 24, 18, 100},
                                           RopeCase{1, 5, 2, 8, 2, 0}));

TEST(RotaryTest, OffsetMatchesLaterPositionsOfLongerSequence) {
  Tensor full = testing::RandomTensor({1, 12, 2, 24}, DType::kFloat32, 5);
  Tensor yfull = Tensor::Empty(full.shape(), DType::kFloat32);
  ASSERT_TRUE(RotaryForward(full, {}, &yfull).ok());
  // Positions 9..11 alone, offset 9 (generation with a KV cache).
  const std::vector<float> all = full.ToFloats();
  std::vector<float> tail(all.begin() + 9 * 48, all.end());
  Tensor x = Tensor::FromVector(tail, {1, 3, 2, 24}).value();
  Tensor y = Tensor::Empty(x.shape(), DType::kFloat32);
  RotaryOptions opt;
  opt.position_offset = 9;
  ASSERT_TRUE(RotaryForward(x, opt, &y).ok());
  const std::vector<double> yall = yfull.ToDoubles();
  std::vector<double> want(yall.begin() + 9 * 48, yall.end());
  ExpectClose(y.ToDoubles(), want, 0, 0, "offset");
}

TEST(RotaryTest, SixteenBitWithinRounding) {
  const Shape shape = {2, 33, 2, 24};
  for (DType dt : {DType::kBFloat16, DType::kFloat16}) {
    // One output rounding: 2^-8 (bf16) or 2^-11 (fp16) relative.
    const double tol = dt == DType::kBFloat16 ? 8e-3 : 1e-3;
    Tensor x = testing::RandomTensor(shape, dt, 8);
    Tensor y = Tensor::Empty(shape, dt);
    ASSERT_TRUE(RotaryForward(x, {}, &y).ok());
    ExpectClose(y.ToDoubles(), RopeRef(x.ToDoubles(), 2, 33, 2, 24, 24, 0),
                tol / 2, tol, std::string(DTypeName(dt)));
    Tensor dx = Tensor::Empty(shape, DType::kFloat32);  // 16-bit in, fp32 out
    ASSERT_TRUE(RotaryBackward(y, {}, &dx).ok());
    ExpectClose(dx.ToDoubles(), x.ToDoubles(), tol, tol, "rope round trip");
  }
}

// Llama 3's rescaled inverse frequencies, written as Hugging Face states the
// rule (masks over the whole vector: low frequencies divided, the band
// between interpolated, high frequencies kept), in float64.
std::vector<double> Llama3InvFreqRef(double base, int64_t dim, double factor,
                                     double low, double high, double original) {
  const double pi = std::acos(-1.0);
  std::vector<double> out;
  for (int64_t j = 0; j < dim; j += 2) {
    const double f = 1.0 / std::pow(base, static_cast<double>(j) / dim);
    const double wavelen = 2 * pi / f;
    const double divided = wavelen > original / low ? f / factor : f;
    const double s = (original / wavelen - low) / (high - low);
    const double smoothed = (1 - s) * divided / factor + s * divided;
    const bool medium =
        !(wavelen < original / high) && !(wavelen > original / low);
    out.push_back(medium ? smoothed : divided);
  }
  return out;
}

TEST(RotaryTest, Llama3ScalingMatchesReferenceInAllThreeBands) {
  RotaryOptions opt;
  opt.base = 10000.0;
  opt.llama3.enabled = true;
  opt.llama3.factor = 8.0;
  opt.llama3.low_freq_factor = 1.0;
  opt.llama3.high_freq_factor = 4.0;
  // Wavelengths below 16 kept, above 64 divided by 8, between interpolated.
  opt.llama3.original_max_position_embeddings = 64;
  const int64_t d = 64;
  const std::vector<double> got = RotaryInverseFrequencies(opt, d);
  const std::vector<double> want =
      Llama3InvFreqRef(10000.0, d, 8.0, 1.0, 4.0, 64.0);
  ASSERT_EQ(got.size(), want.size());
  int kept = 0, divided = 0, between = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-15 * want[i]) << "pair " << i;
    const double plain = std::pow(10000.0, -2.0 * i / d);
    if (got[i] == plain) {
      ++kept;
    } else if (std::abs(got[i] - plain / 8.0) < 1e-18) {
      ++divided;
    } else {
      EXPECT_LT(got[i], plain);
      EXPECT_GT(got[i], plain / 8.0);
      ++between;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(between, 0);
  // Llama 3.1 8B's values (base 500000, head_dim 128, factor 8, 1, 4, 8192).
  opt.base = 500000.0;
  opt.llama3.original_max_position_embeddings = 8192;
  const std::vector<double> llama31 = RotaryInverseFrequencies(opt, 128);
  const std::vector<double> want31 =
      Llama3InvFreqRef(500000.0, 128, 8.0, 1.0, 4.0, 8192.0);
  for (size_t i = 0; i < llama31.size(); ++i) {
    EXPECT_NEAR(llama31[i], want31[i], 1e-15 * want31[i]) << "pair " << i;
  }
  // Off: the plain frequencies.
  opt.llama3.enabled = false;
  EXPECT_EQ(RotaryInverseFrequencies(opt, 128)[5],
            std::pow(500000.0, -10.0 / 128));
}

TEST(RotaryTest, Llama3ScalingRotatesByTheScaledAngles) {
  RotaryOptions opt;
  opt.llama3.enabled = true;
  opt.llama3.original_max_position_embeddings = 32;
  opt.position_offset = 7;
  const int64_t b = 1, s = 9, h = 2, d = 32;
  Tensor x = testing::RandomTensor({b, s, h, d}, DType::kFloat32, 31);
  Tensor y = Tensor::Empty(x.shape(), DType::kFloat32);
  ASSERT_TRUE(RotaryForward(x, opt, &y).ok());
  const std::vector<double> f =
      Llama3InvFreqRef(10000.0, d, 8.0, 1.0, 4.0, 32.0);
  const std::vector<double> xd = x.ToDoubles();
  std::vector<double> want = xd;
  for (int64_t t = 0; t < s; ++t) {
    for (int64_t hh = 0; hh < h; ++hh) {
      const int64_t o = (t * h + hh) * d;
      for (int64_t i = 0; i < d / 2; ++i) {
        const double th = (t + 7) * f[i];
        want[o + i] =
            xd[o + i] * std::cos(th) - xd[o + i + d / 2] * std::sin(th);
        want[o + i + d / 2] =
            xd[o + i + d / 2] * std::cos(th) + xd[o + i] * std::sin(th);
      }
    }
  }
  ExpectClose(y.ToDoubles(), want, 2e-6, 1e-5, "llama3 rope");
  // The angle table is cached: the unscaled rotation must not be reused.
  RotaryOptions plain = opt;
  plain.llama3.enabled = false;
  Tensor y2 = Tensor::Empty(x.shape(), DType::kFloat32);
  ASSERT_TRUE(RotaryForward(x, plain, &y2).ok());
  EXPECT_NE(y2.ToDoubles(), y.ToDoubles());
}

TEST(RotaryTest, BadLlama3ScalingIsRefusedByName) {
  Tensor x = Tensor::Full({1, 2, 1, 8}, 1.0, DType::kFloat32);
  Tensor y = Tensor::Full({1, 2, 1, 8}, 4.0, DType::kFloat32);
  RotaryOptions opt;
  opt.llama3.enabled = true;
  opt.llama3.high_freq_factor = 1.0;
  absl::Status s = RotaryForward(x, opt, &y);
  EXPECT_NE(s.message().find("high_freq_factor"), std::string::npos) << s;
  opt.llama3.high_freq_factor = 4.0;
  opt.llama3.factor = 0.5;
  s = RotaryForward(x, opt, &y);
  EXPECT_NE(s.message().find("factor must be >= 1"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(y, 4.0));
}

TEST(RotaryTest, BadInputsNameShapesAndLeaveOutputAlone) {
  Tensor x = Tensor::Full({2, 5, 3, 8}, 1.0, DType::kFloat32);
  Tensor y = Tensor::Full({2, 5, 3, 9}, 4.0, DType::kFloat32);
  absl::Status s = RotaryForward(x, {}, &y);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[2, 5, 3, 8]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[2, 5, 3, 9]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(y, 4.0));
  Tensor y2 = Tensor::Full({2, 5, 3, 8}, 4.0, DType::kFloat32);
  RotaryOptions odd;
  odd.rotary_dim = 5;
  s = RotaryForward(x, odd, &y2);
  EXPECT_NE(s.message().find("rotary_dim 5"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(y2, 4.0));
  Tensor x3 = Tensor::Full({10, 3, 8}, 1.0, DType::kFloat32);
  Tensor y3 = Tensor::Full({10, 3, 8}, 4.0, DType::kFloat32);
  s = RotaryForward(x3, {}, &y3);
  EXPECT_NE(s.message().find("[10, 3, 8]"), std::string::npos) << s;
  EXPECT_TRUE(testing::AllEqual(y3, 4.0));
}

TEST(RotaryTestDevice, MatchesCpuBitForBit) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Tensor x = testing::RandomTensor({2, 5, 3, 8}, dt, 1);
    Tensor y = Tensor::Zeros({2, 5, 3, 8}, dt);
    RotaryOptions options;
    options.rotary_dim = 6;
    options.position_offset = 3;
    testing::ExpectSameOnTestDevice({x, y}, [&](std::vector<Tensor>& t) {
      return RotaryForward(t[0], options, &t[1]);
    });
    testing::ExpectSameOnTestDevice({x}, [&](std::vector<Tensor>& t) {
      return RotaryBackward(t[0], options, &t[0]);  // In place.
    });
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
