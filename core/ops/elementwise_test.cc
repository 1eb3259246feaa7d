#include "core/ops/elementwise.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/ops/test_util.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectSameOnTestDevice;
using testing::RandomTensor;

constexpr DType kFloats[] = {DType::kFloat32, DType::kBFloat16,
                             DType::kFloat16};

// The value a float computed in fp32 has once stored in dtype.
double Stored(float v, DType dtype) {
  Tensor t = *Tensor::FromVector({v}, {1}, dtype);
  return t.ToDoubles()[0];
}

TEST(FillTest, EveryDtypeOnCpuAndTestDevice) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                      DType::kInt32, DType::kInt64}) {
    Tensor x = Tensor::Zeros({3, 5}, dtype);
    auto out = ExpectSameOnTestDevice(
        {x}, [](std::vector<Tensor>& t) { return Fill(-2.5, &t[0]); },
        std::string(DTypeName(dtype)));
    const double want = IsFloatingPoint(dtype) ? -2.5 : -2.0;
    for (double v : out[0].ToDoubles()) EXPECT_EQ(v, want) << DTypeName(dtype);
  }
}

TEST(FillTest, TensorFillAndZeroStayOnTheDevice) {
  Tensor t = Tensor::Empty({1000}, DType::kBFloat16, Device::TestDevice());
  const int64_t to = mcc::testing::TestDeviceCopiesToHost();
  const int64_t from = mcc::testing::TestDeviceCopiesFromHost();
  t.Fill(3.0);
  Tensor f = *t.To(DType::kFloat32);
  t.Zero();
  EXPECT_EQ(mcc::testing::TestDeviceCopiesToHost(), to);
  EXPECT_EQ(mcc::testing::TestDeviceCopiesFromHost(), from);
  EXPECT_EQ(f.device(), Device::TestDevice());
  EXPECT_EQ(f.ToFloats(), std::vector<float>(1000, 3.0f));
  EXPECT_EQ(t.ToFloats(), std::vector<float>(1000, 0.0f));
}

TEST(FillTest, NegativeZeroKeepsItsSign) {
  Tensor t = Tensor::Full({4}, -0.0, DType::kFloat32);
  for (float v : t.ToFloats()) EXPECT_TRUE(std::signbit(v));
}

TEST(ConvertTest, MatchesConvertElementsOnEveryPair) {
  for (DType from : kFloats) {
    for (DType to : {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                     DType::kInt32, DType::kInt64}) {
      Tensor src = RandomTensor({7, 9}, from, 1, -50.0f, 50.0f);
      Tensor dst = Tensor::Zeros({63}, to);
      auto out = ExpectSameOnTestDevice({src, dst}, [](std::vector<Tensor>& t) {
        return Convert(t[0], &t[1]);
      });
      Tensor want = Tensor::Empty({63}, to);
      ConvertElements(src.raw_data(), from, want.raw_data(), to, 63);
      EXPECT_EQ(out[1].ToDoubles(), want.ToDoubles())
          << DTypeName(from) << " -> " << DTypeName(to);
    }
  }
}

TEST(ConvertTest, RefusesPartialOverlapAndOtherCounts) {
  Tensor flat = Tensor::Zeros({8}, DType::kFloat32);
  Tensor a = *flat.Slice(0, 4), b = *flat.Slice(2, 6), c = *flat.Slice(4, 8);
  EXPECT_FALSE(Convert(a, &b).ok());
  EXPECT_TRUE(Convert(a, &c).ok());  // Apart within one buffer.
  Tensor d = Tensor::Zeros({5}, DType::kFloat32);
  EXPECT_FALSE(Convert(a, &d).ok());
  Tensor e = Tensor::Zeros({4}, DType::kFloat32, Device::TestDevice());
  EXPECT_FALSE(Convert(a, &e).ok());  // Two devices.
}

TEST(ScaleTest, MatchesFp32ProductRoundedOnce) {
  for (DType xd : kFloats) {
    for (DType yd : kFloats) {
      Tensor x = RandomTensor({5, 300}, xd, 2);
      Tensor y = Tensor::Zeros({1500}, yd);
      auto out = ExpectSameOnTestDevice({x, y}, [](std::vector<Tensor>& t) {
        return Scale(t[0], 0.37f, &t[1]);
      });
      const std::vector<float> xv = x.ToFloats();
      const std::vector<double> got = out[1].ToDoubles();
      for (size_t i = 0; i < xv.size(); ++i) {
        ASSERT_EQ(got[i], Stored(0.37f * xv[i], yd)) << i;
      }
    }
  }
}

TEST(ScaleTest, InPlace) {
  Tensor x = RandomTensor({1000}, DType::kFloat32, 3);
  const std::vector<float> xv = x.ToFloats();
  auto out = ExpectSameOnTestDevice(
      {x}, [](std::vector<Tensor>& t) { return Scale(t[0], 0.5f, &t[0]); });
  const std::vector<float> got = out[0].ToFloats();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(got[i], 0.5f * xv[i]);
}

TEST(AddTest, MatchesFp32SumRoundedOnce) {
  for (DType d : kFloats) {
    Tensor a = RandomTensor({3, 1100}, d, 4);
    Tensor b = RandomTensor({3, 1100}, DType::kFloat32, 5);
    Tensor y = Tensor::Zeros({3, 1100}, d);
    auto out = ExpectSameOnTestDevice({a, b, y}, [](std::vector<Tensor>& t) {
      return Add(t[0], t[1], &t[2]);
    });
    const std::vector<float> av = a.ToFloats(), bv = b.ToFloats();
    const std::vector<double> got = out[2].ToDoubles();
    for (size_t i = 0; i < av.size(); ++i) {
      ASSERT_EQ(got[i], Stored(av[i] + bv[i], d)) << i;
    }
    // In place into a.
    auto in_place = ExpectSameOnTestDevice(
        {a, b}, [](std::vector<Tensor>& t) { return Add(t[0], t[1], &t[0]); });
    EXPECT_EQ(in_place[0].ToDoubles(), got);
  }
}

// Every dtype triple, a length that leaves a tail of 13, and values that
// test the rounding: NaN, infinities, bf16/fp16 halfway cases, fp32
// denormals and sums that overflow 16 bits. The result must be the fp32 sum
// of the widened operands rounded once to y's dtype, bit for bit.
TEST(AddTest, EveryDtypeTripleBitForBitWithSpecialValues) {
  const int64_t n = 16 * 70 + 13;
  std::vector<float> av = RandomTensor({n}, DType::kFloat32, 6).ToFloats();
  std::vector<float> bv = RandomTensor({n}, DType::kFloat32, 7).ToFloats();
  const float specials[][2] = {
      {std::nanf(""), 1.0f},
      {1.0f, -std::nanf("")},
      {INFINITY, -INFINITY},
      {INFINITY, 1.0f},
      {1.0f, 0x1.0p-8f},       // 1 + 2^-8: a bf16 halfway
                               // case (ties to even)
      {1.0f, 0x1.8p-8f},       // above halfway: rounds up
      {0x1.02p0f, 0x1.0p-8f},  // odd bf16 mantissa at halfway: rounds up
      {1.0f, 0x1.0p-11f},      // fp16 halfway case
      {1e-39f, 2e-39f},        // fp32 denormals (bf16 keeps them)
      {-1e-39f, 0.0f},
      {65504.0f, 32.0f},  // overflows fp16
      {3e38f, 3e38f},     // overflows fp32 and bf16
      {-0.0f, -0.0f},
  };
  for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); ++i) {
    // Once inside the whole 16-element vectors, once in the tail.
    av[37 + 3 * i] = av[n - 13 + i] = specials[i][0];
    bv[37 + 3 * i] = bv[n - 13 + i] = specials[i][1];
  }
  for (DType ad : kFloats) {
    for (DType bd : kFloats) {
      for (DType yd : kFloats) {
        Tensor a = *Tensor::FromVector(av, {n}, ad);
        Tensor b = *Tensor::FromVector(bv, {n}, bd);
        Tensor y = Tensor::Zeros({n}, yd);
        ASSERT_TRUE(Add(a, b, &y).ok());
        const std::vector<float> aw = a.ToFloats(), bw = b.ToFloats();
        std::vector<float> sums(n);
        for (int64_t i = 0; i < n; ++i) sums[i] = aw[i] + bw[i];
        const Tensor want = *Tensor::FromVector(sums, {n}, yd);
        ASSERT_EQ(testing::Bytes(y), testing::Bytes(want))
            << DTypeName(ad) << " + " << DTypeName(bd) << " -> "
            << DTypeName(yd);
      }
    }
  }
}

TEST(AccumulateTest, IsOneFusedMultiplyAdd) {
  for (DType xd : kFloats) {
    Tensor x = RandomTensor({2500}, xd, 6);
    Tensor y = RandomTensor({2500}, DType::kFloat32, 7);
    auto out = ExpectSameOnTestDevice({x, y}, [](std::vector<Tensor>& t) {
      return Accumulate(t[0], -0.3f, &t[1]);
    });
    const std::vector<float> xv = x.ToFloats(), yv = y.ToFloats();
    const std::vector<float> got = out[1].ToFloats();
    for (size_t i = 0; i < xv.size(); ++i) {
      ASSERT_EQ(got[i], std::fma(-0.3f, xv[i], yv[i])) << i;
    }
  }
  Tensor z = Tensor::Zeros({4}, DType::kFloat32);
  EXPECT_FALSE(Accumulate(z, 1.0f, &z).ok());
}

TEST(ElementwiseTest, CudaWithoutKernelsIsUnimplemented) {
  Tensor x = testing::FakeCudaTensor({4}, DType::kFloat32);
  EXPECT_EQ(Scale(x, 2.0f, &x).code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace ops
}  // namespace mcc
