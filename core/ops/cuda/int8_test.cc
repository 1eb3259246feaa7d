// The CUDA kernels of RowAbsMax, QuantizeRowsInt8 and Int8Gemm
// (core/ops/int8_quantize.h, core/ops/int8_gemm.h) against the CPU kernels
// on the same random inputs, odd sizes, every dtype the ops take. Skips
// without a CUDA device (the *_on_test_device build runs it in CI; see
// test_util.h).
//
// Bounds: RowAbsMax and QuantizeRowsInt8 are exact functions of the input
// bits on both sides (a maximum; one correctly rounded division and a
// round-to-nearest-even), so they must agree bit for bit, errors included:
// the same first offending row and last offending column. Int8Gemm: each
// side is within B = (gamma_k + u (1 + gamma_k)) s sum_p |x q| of the exact
// product (the op's contract, u = 2^-24, gamma_k = k u / (1 - k u)), so
// they differ by at most 2 B before rounding y; a 16-bit y rounds each
// side once more, by at most one ulp of its type (relative OutputUlp) at
// values within 2 B of each other: 2 B + OutputUlp (2 |want| + 2 B).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/cuda/int8_quantize.h"
#include "core/ops/cuda/test_util.h"
#include "core/ops/int8_gemm.h"
#include "core/ops/int8_quantize.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using testing::CudaTest;
using testing::KernelDevice;
using testing::kU32;
using testing::OutputUlp;
using testing::RandomHost;
using testing::SameBytes;
using testing::ToCuda;
using testing::Values;
using testing::WithinBound;

const DType kFloatTypes[] = {DType::kFloat32, DType::kBFloat16,
                             DType::kFloat16};

struct Size {
  int64_t rows, cols;
};
const Size kSizes[] = {{1, 1}, {37, 129}, {3, 1031}, {70, 33}, {4, 0}};

// The message from the offending element on: the CPU's and the device's
// differ only in how they describe w (its device).
std::string FromRow(const absl::Status& s) {
  const std::string m(s.message());
  const size_t at = m.find(" row ");
  return at == std::string::npos ? m : m.substr(at);
}

class CudaInt8Test : public CudaTest {};

// The kernels report the smallest key over the offending elements: that
// must be the first offending row and its last offending column, as the
// CPU kernels name them. (Host-side: runs without a GPU.)
TEST(Int8BadKeyTest, SmallestKeyIsFirstRowLastColumn) {
  const int64_t cols = 13;
  const std::vector<std::pair<int64_t, int64_t>> bad = {
      {7, 2}, {3, 5}, {3, 11}, {3, 0}, {9, 12}};
  unsigned long long smallest = ~0ull;
  for (const auto& [r, c] : bad) {
    smallest = std::min(smallest, cuda_kernels::BadKey(r, c, cols));
    int64_t row, col;
    cuda_kernels::DecodeBadKey(cuda_kernels::BadKey(r, c, cols), cols, &row,
                               &col);
    EXPECT_EQ(row, r);
    EXPECT_EQ(col, c);
  }
  int64_t row, col;
  cuda_kernels::DecodeBadKey(smallest, cols, &row, &col);
  EXPECT_EQ(row, 3);
  EXPECT_EQ(col, 11);
}

TEST_F(CudaInt8Test, RowAbsMax) {
  for (DType dt : kFloatTypes) {
    for (const Size& size : kSizes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dt), " ", size.rows, "x", size.cols));
      const Tensor w = RandomHost({size.rows, size.cols}, dt, 1, -3.0f, 3.0f);
      Tensor mh = Tensor::Empty({size.rows}, DType::kFloat32);
      Tensor md = Tensor::Empty({size.rows}, DType::kFloat32, KernelDevice());
      ASSERT_TRUE(RowAbsMax(w, &mh).ok());
      ASSERT_TRUE(RowAbsMax(ToCuda(w), &md).ok());
      EXPECT_TRUE(SameBytes(md, mh));
    }
  }
}

// Non-finite weights: the first offending row, its last offending column.
TEST_F(CudaInt8Test, RowAbsMaxNamesTheFirstBadRowAndItsLastBadColumn) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(DTypeName(dt));
    std::vector<float> v(9 * 21, 0.5f);
    v[3 * 21 + 5] = INFINITY;
    v[3 * 21 + 17] = NAN;
    v[7 * 21 + 2] = -INFINITY;
    const Tensor w = *Tensor::FromVector(v, {9, 21}, dt);
    Tensor mh = Tensor::Empty({9}, DType::kFloat32);
    Tensor md = Tensor::Empty({9}, DType::kFloat32, KernelDevice());
    const absl::Status cpu = RowAbsMax(w, &mh);
    const absl::Status dev = RowAbsMax(ToCuda(w), &md);
    ASSERT_FALSE(cpu.ok());
    EXPECT_EQ(dev.code(), cpu.code()) << dev;
    EXPECT_EQ(FromRow(dev), FromRow(cpu));
    EXPECT_NE(FromRow(dev).find("row 3 column 17"), std::string::npos) << dev;
  }
}

// Random rows, a zero row, row maxima above the rows' own (a shard of a
// row-parallel weight), and exact ties (s = 1: halves round to even).
TEST_F(CudaInt8Test, QuantizeRowsInt8) {
  for (DType dt : kFloatTypes) {
    for (const Size& size : kSizes) {
      for (float widen : {1.0f, 1.5f}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dt), " ", size.rows, "x", size.cols,
                                  " absmax x", widen));
        std::vector<double> wv =
            Values(RandomHost({size.rows, size.cols}, dt, 3, -3.0f, 3.0f));
        std::vector<float> wf(wv.begin(), wv.end());
        if (size.rows > 2 && size.cols > 0) {
          for (int64_t c = 0; c < size.cols; ++c) wf[c] = 0.0f;  // Row 0.
          // Row 1: max 127 (s = 1 exactly), then k + 1/2 values.
          float* r1 = wf.data() + size.cols;
          for (int64_t c = 0; c < size.cols; ++c) {
            r1[c] = c == 0 ? 127.0f : std::fmod(c * 0.5f, 20.0f) - 10.0f;
          }
        }
        const Tensor w = *Tensor::FromVector(wf, {size.rows, size.cols}, dt);
        Tensor absmax = Tensor::Empty({size.rows}, DType::kFloat32);
        ASSERT_TRUE(RowAbsMax(w, &absmax).ok());
        std::vector<double> mv = Values(absmax);
        std::vector<float> mf(mv.begin(), mv.end());
        for (float& m : mf) m *= widen;
        absmax = *Tensor::FromVector(mf, {size.rows});
        Tensor qh = Tensor::Empty({size.rows, size.cols}, DType::kInt8);
        Tensor sh = Tensor::Empty({size.rows}, DType::kFloat32);
        Tensor qd =
            Tensor::Empty({size.rows, size.cols}, DType::kInt8, KernelDevice());
        Tensor sd = Tensor::Empty({size.rows}, DType::kFloat32, KernelDevice());
        ASSERT_TRUE(QuantizeRowsInt8(w, absmax, &qh, &sh).ok());
        ASSERT_TRUE(QuantizeRowsInt8(ToCuda(w), ToCuda(absmax), &qd, &sd).ok());
        EXPECT_TRUE(SameBytes(qd, qh));
        EXPECT_TRUE(SameBytes(sd, sh));
      }
    }
  }
}

// A weight above its row's maximum, and a nonzero weight in a row whose
// maximum is 0: the same error as the CPU's (first row, last column, the
// maximum given).
TEST_F(CudaInt8Test, QuantizeRowsInt8Errors) {
  for (DType dt : kFloatTypes) {
    SCOPED_TRACE(DTypeName(dt));
    std::vector<float> wf(6 * 13, 0.25f);
    wf[2 * 13 + 4] = 3.0f;  // Above row 2's maximum of 1.
    wf[2 * 13 + 11] = NAN;  // The last offender in row 2.
    wf[4 * 13 + 0] = 0.5f;  // Row 4 has maximum 0.
    const Tensor w = *Tensor::FromVector(wf, {6, 13}, dt);
    const Tensor absmax =
        *Tensor::FromVector({1.0f, 1.0f, 1.0f, 1.0f, 0.0f, 1.0f}, {6});
    Tensor qh = Tensor::Empty({6, 13}, DType::kInt8);
    Tensor sh = Tensor::Empty({6}, DType::kFloat32);
    Tensor qd = Tensor::Empty({6, 13}, DType::kInt8, KernelDevice());
    Tensor sd = Tensor::Empty({6}, DType::kFloat32, KernelDevice());
    const absl::Status cpu = QuantizeRowsInt8(w, absmax, &qh, &sh);
    const absl::Status dev =
        QuantizeRowsInt8(ToCuda(w), ToCuda(absmax), &qd, &sd);
    ASSERT_FALSE(cpu.ok());
    EXPECT_EQ(dev.code(), cpu.code()) << dev;
    EXPECT_EQ(FromRow(dev), FromRow(cpu));
    EXPECT_NE(FromRow(dev).find("row 2 column 11"), std::string::npos) << dev;
  }
}

// Random int8 weights in [-127, 127] and positive scales.
Tensor RandomQ(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-127, 127);
  std::vector<float> v(n * k);
  for (float& x : v) x = static_cast<float>(dist(gen));
  return *Tensor::FromVector(v, {n, k}, DType::kInt8);
}

TEST_F(CudaInt8Test, Int8Gemm) {
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {{1, 1, 1},     {1, 65, 129}, {3, 33, 31},
                        {37, 70, 257}, {70, 33, 1},  {2, 5, 0}};
  for (DType xt : kFloatTypes) {
    for (DType yt : {xt, DType::kFloat32}) {
      for (const Case& c : cases) {
        SCOPED_TRACE(absl::StrCat(DTypeName(xt), " -> ", DTypeName(yt), " m ",
                                  c.m, " n ", c.n, " k ", c.k));
        const Tensor x = RandomHost({c.m, c.k}, xt, 10);
        const Tensor q = RandomQ(c.n, c.k, 11);
        const Tensor s = RandomHost({c.n}, DType::kFloat32, 12, 0.001f, 0.1f);
        Tensor yh = Tensor::Empty({c.m, c.n}, yt);
        Tensor yd = Tensor::Empty({c.m, c.n}, yt, KernelDevice());
        ASSERT_TRUE(Int8Gemm(x, q, s, &yh).ok());
        ASSERT_TRUE(Int8Gemm(ToCuda(x), ToCuda(q), ToCuda(s), &yd).ok());
        const std::vector<double> xv = Values(x), qv = Values(q),
                                  sv = Values(s), want = Values(yh);
        const double gamma = c.k * kU32 / (1 - c.k * kU32);
        std::vector<double> bound(want.size());
        for (int64_t i = 0; i < c.m; ++i) {
          for (int64_t j = 0; j < c.n; ++j) {
            double abs_sum = 0;
            for (int64_t p = 0; p < c.k; ++p) {
              abs_sum += std::fabs(xv[i * c.k + p] * qv[j * c.k + p]);
            }
            const double b = (gamma + kU32 * (1 + gamma)) * sv[j] * abs_sum;
            const double w = std::fabs(want[i * c.n + j]);
            bound[i * c.n + j] =
                2 * b + OutputUlp(yt) * (2 * w + 2 * b) + 1e-30;
          }
        }
        EXPECT_TRUE(WithinBound(Values(yd), want, bound));
      }
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
