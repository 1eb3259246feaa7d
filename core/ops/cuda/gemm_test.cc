// ops::Gemm and ops::BatchedGemm on CUDA tensors (cuBLAS, registered by
// //core/ops/cuda:registrations) against the CPU kernel on the same random
// operands: every transpose pair, alpha and beta, odd sizes, every dtype mix
// the op takes (including the ones cuBLAS cannot write directly), a shared
// 2-D b in the batched form, k == 0, and beta == 0 ignoring NaNs in c. Skips
// without a CUDA device.
//
// Bound: both sides multiply exactly-representable products (16-bit
// operands widen exactly; fp32 products round once) and accumulate in fp32,
// each within k u' sum_l |a_il b_lj| of the exact dot product, where u' is
// u = 2^-24 for round-to-nearest and 2u for accumulators that truncate
// (tensor cores may): 3 k u sum|a b| between them, times |alpha|; beta c
// and the sum round once more each side (2u (|beta c| + |c|)); a 16-bit c
// adds one ulp (test_util.h's OutputUlp).
#include "core/ops/gemm.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/cuda/test_util.h"
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
using testing::ToCuda;
using testing::Values;
using testing::WithinBound;

struct DTypes {
  DType in, out;
};
const DTypes kMixes[] = {
    {DType::kFloat32, DType::kFloat32},  {DType::kBFloat16, DType::kBFloat16},
    {DType::kBFloat16, DType::kFloat32}, {DType::kFloat16, DType::kFloat16},
    {DType::kFloat16, DType::kFloat32},  {DType::kFloat32, DType::kBFloat16},
    {DType::kBFloat16, DType::kFloat16},
};

Shape OperandShape(int64_t batch, int64_t rows, int64_t cols, bool trans) {
  Shape s = trans ? Shape{cols, rows} : Shape{rows, cols};
  if (batch > 0) s.insert(s.begin(), batch);
  return s;
}

// The bound for each element of c (see the file comment).
std::vector<double> Bound(const std::vector<double>& a,
                          const std::vector<double>& b,
                          const std::vector<double>& c0,
                          const std::vector<double>& want, int64_t batch,
                          bool b_shared, int64_t m, int64_t n, int64_t k,
                          bool ta, bool tb, float alpha, float beta,
                          DType out) {
  std::vector<double> bound(want.size());
  const int64_t nb = batch == 0 ? 1 : batch;
  for (int64_t p = 0; p < nb; ++p) {
    const double* ap = &a[p * m * k];
    const double* bp = &b[b_shared ? 0 : p * k * n];
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double abs_dot = 0;
        for (int64_t l = 0; l < k; ++l) {
          const double av = ta ? ap[l * m + i] : ap[i * k + l];
          const double bv = tb ? bp[j * k + l] : bp[l * n + j];
          abs_dot += std::fabs(av * bv);
        }
        const int64_t idx = p * m * n + i * n + j;
        const double beta_c = beta == 0.0f ? 0.0 : std::fabs(beta * c0[idx]);
        bound[idx] = 3 * k * kU32 * std::fabs(alpha) * abs_dot +
                     2 * kU32 * (beta_c + std::fabs(want[idx])) +
                     OutputUlp(out) * 2 * std::fabs(want[idx]) + 1e-30;
      }
    }
  }
  return bound;
}

class CudaGemmTest : public CudaTest {
 protected:
  // batch 0: Gemm on 2-D tensors; batch > 0: BatchedGemm (b 2-D and shared
  // when b_shared).
  void RunCase(const DTypes& dt, int64_t batch, bool b_shared, int64_t m,
               int64_t n, int64_t k, float alpha, float beta) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        SCOPED_TRACE(absl::StrCat(
            DTypeName(dt.in), "->", DTypeName(dt.out), " batch ", batch,
            b_shared ? " (b shared)" : "", " m ", m, " n ", n, " k ", k, " ta ",
            ta, " tb ", tb, " alpha ", alpha, " beta ", beta));
        const Tensor a = RandomHost(OperandShape(batch, m, k, ta), dt.in, 1);
        const Tensor b =
            RandomHost(OperandShape(b_shared ? 0 : batch, k, n, tb), dt.in, 2);
        const Shape cs = batch > 0 ? Shape{batch, m, n} : Shape{m, n};
        const Tensor c0 = RandomHost(cs, dt.out, 3);
        Tensor ch = c0.Clone();
        Tensor cd = ToCuda(c0);
        if (batch > 0) {
          ASSERT_TRUE(BatchedGemm(a, ta, b, tb, &ch, alpha, beta).ok());
          ASSERT_TRUE(
              BatchedGemm(ToCuda(a), ta, ToCuda(b), tb, &cd, alpha, beta).ok());
        } else {
          ASSERT_TRUE(Gemm(a, ta, b, tb, &ch, alpha, beta).ok());
          ASSERT_TRUE(
              Gemm(ToCuda(a), ta, ToCuda(b), tb, &cd, alpha, beta).ok());
        }
        const std::vector<double> want = Values(ch);
        EXPECT_TRUE(
            WithinBound(Values(cd), want,
                        Bound(Values(a), Values(b), Values(c0), want, batch,
                              b_shared, m, n, k, ta, tb, alpha, beta, dt.out)));
      }
    }
  }
};

TEST_F(CudaGemmTest, EveryDTypeMixAndTranspose) {
  for (const DTypes& dt : kMixes) {
    RunCase(dt, 0, false, 7, 5, 3, 1.0f, 0.0f);
    RunCase(dt, 0, false, 33, 65, 129, 1.5f, 0.5f);
    RunCase(dt, 0, false, 1, 300, 17, -0.5f, 1.0f);
  }
}

TEST_F(CudaGemmTest, Batched) {
  for (const DTypes& dt : kMixes) {
    RunCase(dt, 3, false, 17, 9, 31, 1.0f, 0.0f);
    RunCase(dt, 4, true, 5, 12, 7, 0.75f, 1.0f);
  }
}

// An empty product leaves beta * c, and zeros for beta == 0.
TEST_F(CudaGemmTest, EmptyInnerDimension) {
  for (float beta : {0.0f, 0.5f}) {
    const Tensor a = Tensor::Zeros({4, 0}, DType::kFloat32);
    const Tensor b = Tensor::Zeros({0, 6}, DType::kFloat32);
    const Tensor c0 = RandomHost({4, 6}, DType::kFloat32, 4);
    Tensor ch = c0.Clone();
    Tensor cd = ToCuda(c0);
    ASSERT_TRUE(Gemm(a, false, b, false, &ch, 1.0f, beta).ok());
    ASSERT_TRUE(Gemm(ToCuda(a), false, ToCuda(b), false, &cd, 1.0f, beta).ok());
    EXPECT_EQ(Values(cd), Values(ch)) << "beta " << beta;
  }
}

// beta == 0 never reads c: NaNs there do not reach the result.
TEST_F(CudaGemmTest, BetaZeroIgnoresNaNInC) {
  for (const DTypes& dt : kMixes) {
    SCOPED_TRACE(absl::StrCat(DTypeName(dt.in), "->", DTypeName(dt.out)));
    const Tensor a = RandomHost({9, 11}, dt.in, 5);
    const Tensor b = RandomHost({11, 13}, dt.in, 6);
    Tensor c = Tensor::Full({9, 13}, std::numeric_limits<double>::quiet_NaN(),
                            dt.out, KernelDevice());
    ASSERT_TRUE(Gemm(ToCuda(a), false, ToCuda(b), false, &c).ok());
    for (double v : Values(c)) ASSERT_FALSE(std::isnan(v));
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
