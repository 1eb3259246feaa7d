#include "core/ops/int8_quantize.h"

#include <cmath>
#include <vector>

#include "core/ops/test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::RandomTensor;

struct Quantized {
  Tensor q, scales;
};

Quantized Quantize(const Tensor& w) {
  Tensor absmax = Tensor::Empty({w.size(0)}, DType::kFloat32);
  EXPECT_TRUE(RowAbsMax(w, &absmax).ok());
  Quantized out{Tensor::Empty(w.shape(), DType::kInt8),
                Tensor::Empty({w.size(0)}, DType::kFloat32)};
  const absl::Status s = QuantizeRowsInt8(w, absmax, &out.q, &out.scales);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(Int8QuantizeTest, KnownValuesRoundToNearestEven) {
  // absmax 1 -> s = 1/127: 0.5 * 127 = 63.5 (tie, to even 64), 0.25 * 127 =
  // 31.75 -> 32; the second row is all zeros (scale 0, q 0).
  Tensor w = Tensor::FromVector({0.5f, -1.0f, 0.25f, 0.0f, 0.0f, 0.0f}, {2, 3})
                 .value();
  Quantized qs = Quantize(w);
  EXPECT_EQ(qs.q.ToDoubles(), (std::vector<double>{64, -127, 32, 0, 0, 0}));
  EXPECT_EQ(qs.scales.ToFloats()[0], 1.0f / 127.0f);
  EXPECT_EQ(qs.scales.ToFloats()[1], 0.0f);
}

TEST(Int8QuantizeTest, ErrorIsAtMostHalfAStepForEveryDType) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Tensor w = RandomTensor({37, 129}, dtype, 7, -3.0f, 2.0f);
    Quantized qs = Quantize(w);
    const std::vector<double> wv = w.ToDoubles(), qv = qs.q.ToDoubles();
    const std::vector<float> s = qs.scales.ToFloats();
    for (int64_t r = 0; r < 37; ++r) {
      double m = 0;
      for (int64_t c = 0; c < 129; ++c)
        m = std::max(m, std::fabs(wv[r * 129 + c]));
      ASSERT_EQ(s[r], static_cast<float>(m) / 127.0f) << DTypeName(dtype);
      bool hit_127 = false;
      for (int64_t c = 0; c < 129; ++c) {
        const double q = qv[r * 129 + c];
        ASSERT_LE(std::fabs(q), 127);
        hit_127 |= std::fabs(q) == 127;
        // s/2 plus the rounding of s itself (|q| <= 127, relative 2^-24).
        EXPECT_LE(std::fabs(wv[r * 129 + c] - s[r] * q),
                  s[r] * (0.5 + 127 * std::ldexp(1.0, -23)))
            << DTypeName(dtype) << " row " << r << " col " << c;
      }
      EXPECT_TRUE(hit_127) << "the row maximum maps to +-127";
    }
  }
}

// A matrix split along its columns (row-parallel under TP) quantised with the
// whole row's maximum gives exactly the unsplit result.
TEST(Int8QuantizeTest, ColumnShardsWithGlobalMaxEqualTheWhole) {
  Tensor w = RandomTensor({8, 64}, DType::kFloat32, 3);
  Quantized whole = Quantize(w);
  Tensor absmax = Tensor::Empty({8}, DType::kFloat32);
  ASSERT_TRUE(RowAbsMax(w, &absmax).ok());
  const std::vector<float> wv = w.ToFloats();
  const std::vector<double> qv = whole.q.ToDoubles();
  for (int shard = 0; shard < 2; ++shard) {
    std::vector<float> part;
    for (int r = 0; r < 8; ++r) {
      part.insert(part.end(), wv.begin() + r * 64 + shard * 32,
                  wv.begin() + r * 64 + shard * 32 + 32);
    }
    Tensor ws = Tensor::FromVector(part, {8, 32}).value();
    Tensor q = Tensor::Empty({8, 32}, DType::kInt8);
    Tensor s = Tensor::Empty({8}, DType::kFloat32);
    ASSERT_TRUE(QuantizeRowsInt8(ws, absmax, &q, &s).ok());
    EXPECT_EQ(s.ToFloats(), whole.scales.ToFloats());
    const std::vector<double> qsv = q.ToDoubles();
    for (int r = 0; r < 8; ++r) {
      for (int c = 0; c < 32; ++c) {
        ASSERT_EQ(qsv[r * 32 + c], qv[r * 64 + shard * 32 + c]);
      }
    }
  }
}

TEST(Int8QuantizeTest, BadInputsNameTheProblem) {
  Tensor w = Tensor::FromVector({1.0f, NAN, 0.5f, 2.0f}, {2, 2}).value();
  Tensor absmax = Tensor::Empty({2}, DType::kFloat32);
  absl::Status s = RowAbsMax(w, &absmax);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("non-finite value at row 0 column 1"),
            std::string::npos)
      << s;
  // An absmax below the row's own maximum.
  Tensor w2 = Tensor::FromVector({1.0f, 0.5f}, {1, 2}).value();
  Tensor small = Tensor::FromVector({0.5f}, {1}).value();
  Tensor q = Tensor::Empty({1, 2}, DType::kInt8);
  Tensor sc = Tensor::Empty({1}, DType::kFloat32);
  s = QuantizeRowsInt8(w2, small, &q, &sc);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("row 0 column 0 exceeds"), std::string::npos) << s;
  // Wrong output dtype.
  Tensor qf = Tensor::Empty({1, 2}, DType::kFloat32);
  s = QuantizeRowsInt8(w2, Tensor::FromVector({1.0f}, {1}).value(), &qf, &sc);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("q"), std::string::npos) << s;
}

TEST(Int8QuantizeTest, TestDeviceAgreesBitForBit) {
  Tensor w = RandomTensor({5, 33}, DType::kBFloat16, 11);
  Tensor absmax = Tensor::Empty({5}, DType::kFloat32);
  ASSERT_TRUE(RowAbsMax(w, &absmax).ok());
  testing::ExpectSameOnTestDevice(
      {w, absmax, Tensor::Empty({5, 33}, DType::kInt8),
       Tensor::Empty({5}, DType::kFloat32)},
      [](std::vector<Tensor>& t) {
        MCC_RETURN_IF_ERROR(RowAbsMax(t[0], &t[1]));
        return QuantizeRowsInt8(t[0], t[1], &t[2], &t[3]);
      });
}

}  // namespace
}  // namespace ops
}  // namespace mcc
