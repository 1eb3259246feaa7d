#include "core/ops/int8_gemm.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/cpu_isa.h"
#include "core/ops/int8_quantize.h"
#include "core/ops/test_util.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::RandomTensor;

// The paths this process can run: every machine runs scalar, AVX2 and the
// dequantised sgemm; AVX-512 where KernelIsa() allows it (the *_avx2 test
// variant caps it with MCC_CPU_ISA=avx2).
std::vector<Int8GemmPath> RunnablePaths() {
  std::vector<Int8GemmPath> paths = {Int8GemmPath::kScalar, Int8GemmPath::kAvx2,
                                     Int8GemmPath::kDequantSgemm,
                                     Int8GemmPath::kAuto};
  if (KernelIsa() == CpuIsa::kAvx512) paths.push_back(Int8GemmPath::kAvx512);
  return paths;
}

class PathScope {
 public:
  explicit PathScope(Int8GemmPath p)
      : saved_(internal::SetInt8GemmPathForTesting(p)) {}
  ~PathScope() { internal::SetInt8GemmPathForTesting(saved_); }

 private:
  Int8GemmPath saved_;
};

// Checks y against the double-precision product of x and the dequantised
// weights, with the bound of the header: fp32 accumulation of K products,
// one multiplication by s, and (bf16 y) one rounding to bf16.
// Returns the number of outputs outside the bound, describing the first in
// *first.
int CountOutsideBound(const Tensor& x, const Tensor& q, const Tensor& s,
                      const Tensor& y, std::string* first) {
  const int64_t m = x.size(0), k = x.size(1), n = q.size(0);
  const std::vector<double> xv = x.ToDoubles(), qv = q.ToDoubles(),
                            sv = s.ToDoubles(), yv = y.ToDoubles();
  const double u = std::ldexp(1.0, -24);
  const double gamma = k * u / (1 - k * u);
  const double bf16_round =
      y.dtype() == DType::kBFloat16 ? std::ldexp(1.0, -8) : 0.0;
  int failures = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, abs_sum = 0;
      for (int64_t p = 0; p < k; ++p) {
        ref += xv[i * k + p] * qv[j * k + p];
        abs_sum += std::fabs(xv[i * k + p] * qv[j * k + p]);
      }
      ref *= sv[j];
      abs_sum *= sv[j];
      const double got = yv[i * n + j];
      const double fp32_bound = (gamma + u * (1 + gamma)) * abs_sum;
      const double tol =
          fp32_bound + bf16_round * (std::fabs(ref) + fp32_bound);
      if (!(std::fabs(got - ref) <= tol)) {
        if (failures++ == 0) {
          *first = absl::StrCat("y[", i, ", ", j, "] got ", got, " want ", ref,
                                " (tol ", tol, ")");
        }
      }
    }
  }
  return failures;
}

void ExpectWithinBound(const Tensor& x, const Tensor& q, const Tensor& s,
                       const Tensor& y, const std::string& what) {
  std::string first;
  const int outside = CountOutsideBound(x, q, s, y, &first);
  EXPECT_EQ(outside, 0) << what << ": " << first;
}

void Quantize(const Tensor& w, Tensor* q, Tensor* s) {
  Tensor absmax = Tensor::Empty({w.size(0)}, DType::kFloat32);
  ASSERT_TRUE(RowAbsMax(w, &absmax).ok());
  *q = Tensor::Empty(w.shape(), DType::kInt8);
  *s = Tensor::Empty({w.size(0)}, DType::kFloat32);
  ASSERT_TRUE(QuantizeRowsInt8(w, absmax, q, s).ok());
}

TEST(Int8GemmTest, EveryPathMeetsTheFp32AccumulationBound) {
  LOG(INFO) << "kernel ISA " << CpuIsaName(KernelIsa());
  const std::vector<int64_t> ms = {1, 3, 4, 5, 17, 33, 64, 65};
  const std::vector<int64_t> ns = {1, 5, 64, 67};
  const std::vector<int64_t> ks = {1, 7, 16, 33, 257, 1024};
  uint32_t seed = 1;
  for (Int8GemmPath path : RunnablePaths()) {
    PathScope scope(path);
    for (int64_t m : ms) {
      for (int64_t n : ns) {
        for (int64_t k : ks) {
          for (DType xd : {DType::kFloat32, DType::kBFloat16}) {
            Tensor w =
                RandomTensor({n, k}, DType::kFloat32, ++seed, -0.1f, 0.1f);
            Tensor q, s;
            Quantize(w, &q, &s);
            Tensor x = RandomTensor({m, k}, xd, ++seed, -4.0f, 4.0f);
            for (DType yd : {xd, DType::kFloat32}) {
              Tensor y = Tensor::Empty({m, n}, yd);
              ASSERT_TRUE(Int8Gemm(x, q, s, &y).ok());
              ExpectWithinBound(
                  x, q, s, y,
                  absl::StrCat(Int8GemmPathName(path), " m=", m, " n=", n,
                               " k=", k, " x ", DTypeName(xd), " y ",
                               DTypeName(yd)));
              if (HasFailure()) return;
            }
          }
        }
      }
    }
  }
}

// k == 0: an empty product, y = 0 on every path (the direct path once
// divided by k to size its work chunks, the sgemm one had no valid lda).
TEST(Int8GemmTest, EmptyInnerDimensionGivesZeros) {
  for (Int8GemmPath path : RunnablePaths()) {
    SCOPED_TRACE(Int8GemmPathName(path));
    PathScope scope(path);
    const Tensor x = Tensor::Zeros({3, 0}, DType::kFloat32);
    const Tensor q = Tensor::Zeros({5, 0}, DType::kInt8);
    const Tensor s = Tensor::Full({5}, 0.5, DType::kFloat32);
    Tensor y = Tensor::Full({3, 5}, 7.0, DType::kFloat32);
    ASSERT_TRUE(Int8Gemm(x, q, s, &y).ok());
    for (double v : y.ToDoubles()) EXPECT_EQ(v, 0.0);
  }
}

// The bound is tight enough to catch a wrong weight: flipping one int8
// value by one step moves an output by s |x|, far above the bound.
TEST(Int8GemmTest, BoundCatchesAOneStepWeightError) {
  Tensor w = RandomTensor({8, 256}, DType::kFloat32, 5);
  Tensor q, s;
  Quantize(w, &q, &s);
  Tensor x = RandomTensor({2, 256}, DType::kFloat32, 6, 0.5f, 1.0f);
  Tensor y = Tensor::Empty({2, 8}, DType::kFloat32);
  ASSERT_TRUE(Int8Gemm(x, q, s, &y).ok());
  Tensor q_bad = q.Clone();
  int8_t* qd = q_bad.data<int8_t>();
  qd[3 * 256 + 100] =
      qd[3 * 256 + 100] > 0 ? qd[3 * 256 + 100] - 1 : qd[3 * 256 + 100] + 1;
  std::string first;
  EXPECT_EQ(CountOutsideBound(x, q, s, y, &first), 0) << first;
  EXPECT_GE(CountOutsideBound(x, q_bad, s, y, &first), 2)
      << "one weight changed moves y[0, 3] and y[1, 3]";
}

// Each output's sum order depends only on K: any thread count gives the
// same bits, and the direct paths are deterministic run to run.
TEST(Int8GemmTest, DirectPathIsDeterministic) {
  Tensor w = RandomTensor({130, 515}, DType::kFloat32, 9);
  Tensor q, s;
  Quantize(w, &q, &s);
  Tensor x = RandomTensor({7, 515}, DType::kFloat32, 10);
  Tensor y1 = Tensor::Empty({7, 130}, DType::kFloat32);
  Tensor y2 = Tensor::Empty({7, 130}, DType::kFloat32);
  ASSERT_TRUE(Int8Gemm(x, q, s, &y1).ok());
  ASSERT_TRUE(Int8Gemm(x, q, s, &y2).ok());
  EXPECT_EQ(testing::Bytes(y1), testing::Bytes(y2));
}

TEST(Int8GemmTest, AutoChoosesByRows) {
  EXPECT_EQ(Int8GemmAutoPath(kInt8DirectMaxRows + 1),
            Int8GemmPath::kDequantSgemm);
  EXPECT_EQ(Int8GemmAutoPath(1), KernelIsa() == CpuIsa::kAvx512
                                     ? Int8GemmPath::kAvx512
                                     : Int8GemmPath::kAvx2);
}

TEST(Int8GemmTest, BadArgumentsNameTheTensorAndWriteNothing) {
  Tensor x = RandomTensor({2, 8}, DType::kFloat32, 1);
  Tensor q = Tensor::Zeros({3, 8}, DType::kInt8);
  Tensor s = Tensor::Zeros({3}, DType::kFloat32);
  Tensor y = Tensor::Zeros({2, 3}, DType::kFloat32);
  const std::vector<uint8_t> before = testing::Bytes(y);
  Tensor q_wrong_k = Tensor::Zeros({3, 7}, DType::kInt8);
  absl::Status st = Int8Gemm(x, q_wrong_k, s, &y);
  EXPECT_NE(st.message().find("shapes do not fit"), std::string::npos) << st;
  Tensor q_float = Tensor::Zeros({3, 8}, DType::kFloat32);
  st = Int8Gemm(x, q_float, s, &y);
  EXPECT_NE(st.message().find("Int8Gemm: q"), std::string::npos) << st;
  Tensor y_bf16 = Tensor::Zeros({2, 3}, DType::kBFloat16);
  st = Int8Gemm(x, q, s, &y_bf16);
  EXPECT_NE(st.message().find("must be fp32 or x's dtype"), std::string::npos)
      << st;
  EXPECT_EQ(testing::Bytes(y), before);
}

TEST(Int8GemmTest, TestDeviceAgreesBitForBit) {
  Tensor w = RandomTensor({19, 40}, DType::kFloat32, 3);
  Tensor q, s;
  Quantize(w, &q, &s);
  testing::ExpectSameOnTestDevice(
      {RandomTensor({3, 40}, DType::kBFloat16, 4), q, s,
       Tensor::Empty({3, 19}, DType::kBFloat16)},
      [](std::vector<Tensor>& t) { return Int8Gemm(t[0], t[1], t[2], &t[3]); });
}

}  // namespace
}  // namespace ops
}  // namespace mcc
