// ops::Gemm and ops::BatchedGemm on CUDA tensors (cuBLASLt, with cuBLAS as
// the fallback; registered by //core/ops/cuda:registrations) against the
// CPU kernel on the same random operands: every transpose pair, alpha and
// beta, odd sizes, every dtype mix the op takes (including the ones cuBLAS
// cannot write directly), a shared 2-D b in the batched form, k == 0, beta
// == 0 ignoring NaNs in c, weight-gradient accumulation into an fp32
// main_grad over several micro-batches, operands at unaligned addresses,
// and TF32 only when allowed. Each case runs on both routes (cuBLASLt, and
// the cublasGemmEx fallback forced). Skips without a CUDA device.
//
// Bound: both sides multiply exactly-representable products (16-bit
// operands widen exactly; fp32 products round once) and accumulate in fp32,
// each within k u' sum_l |a_il b_lj| of the exact dot product, where u' is
// u = 2^-24 for round-to-nearest and 2u for accumulators that truncate
// (tensor cores may): 3 k u sum|a b| between them, times |alpha|; beta c
// and the sum round once more each side (2u (|beta c| + |c|)); a 16-bit c
// adds one ulp (test_util.h's OutputUlp).
#include "core/ops/gemm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/cuda/gemm.h"
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
using testing::OnTestDevice;
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

using internal::CudaGemmRoute;
using internal::SetCudaGemmRouteForTesting;

const CudaGemmRoute kRoutes[] = {CudaGemmRoute::kAuto, CudaGemmRoute::kCublas};

const char* RouteName(CudaGemmRoute route) {
  return route == CudaGemmRoute::kCublas ? "cublasGemmEx" : "cuBLASLt";
}

// Sets the route for one scope.
class ScopedRoute {
 public:
  explicit ScopedRoute(CudaGemmRoute route)
      : previous_(SetCudaGemmRouteForTesting(route)) {}
  ~ScopedRoute() { SetCudaGemmRouteForTesting(previous_); }

 private:
  CudaGemmRoute previous_;
};

class CudaGemmTest : public CudaTest {
 protected:
  void TearDown() override { SetCudaGemmRouteForTesting(CudaGemmRoute::kAuto); }

  // The case on each route.
  void RunCase(const DTypes& dt, int64_t batch, bool b_shared, int64_t m,
               int64_t n, int64_t k, float alpha, float beta) {
    for (CudaGemmRoute route : kRoutes) {
      SCOPED_TRACE(RouteName(route));
      ScopedRoute scoped(route);
      RunCaseOnRoute(dt, batch, b_shared, m, n, k, alpha, beta);
    }
  }

  // batch 0: Gemm on 2-D tensors; batch > 0: BatchedGemm (b 2-D and shared
  // when b_shared).
  void RunCaseOnRoute(const DTypes& dt, int64_t batch, bool b_shared, int64_t m,
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

// Megatron's gradient-accumulation fusion: dW (fp32 main_grad) += dY^T X
// over micro-batches, with bf16 or fp16 dY and X, one GEMM each (no
// staging). The bound adds up over the accumulations. On a GPU, cuBLASLt
// must have run every one of them (no fallback for this, the training
// GEMM).
TEST_F(CudaGemmTest, WeightGradientAccumulatesIntoFp32MainGrad) {
  constexpr int kMicroBatches = 3;
  const int64_t tokens = 37, out_features = 65, in_features = 129;
  for (DType in : {DType::kBFloat16, DType::kFloat16}) {
    for (CudaGemmRoute route : kRoutes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(in), " ", RouteName(route)));
      ScopedRoute scoped(route);
      const Tensor g0 =
          RandomHost({out_features, in_features}, DType::kFloat32, 40);
      Tensor gh = g0.Clone();
      Tensor gd = ToCuda(g0);
      std::vector<double> bound(g0.numel(), 1e-30);
      const CudaGemmRouteCounts before = CudaGemmRoutes();
      for (int mb = 0; mb < kMicroBatches; ++mb) {
        const Tensor dy = RandomHost({tokens, out_features}, in, 41 + 2 * mb);
        const Tensor x = RandomHost({tokens, in_features}, in, 42 + 2 * mb);
        const std::vector<double> c0 = Values(gh);
        ASSERT_TRUE(Gemm(dy, true, x, false, &gh, 1.0f, 1.0f).ok());
        ASSERT_TRUE(
            Gemm(ToCuda(dy), true, ToCuda(x), false, &gd, 1.0f, 1.0f).ok());
        const std::vector<double> step = Bound(
            Values(dy), Values(x), c0, Values(gh), 0, false, out_features,
            in_features, tokens, true, false, 1.0f, 1.0f, DType::kFloat32);
        for (size_t i = 0; i < bound.size(); ++i) bound[i] += step[i];
      }
      EXPECT_TRUE(WithinBound(Values(gd), Values(gh), bound));
      if (!OnTestDevice()) {
        const CudaGemmRouteCounts after = CudaGemmRoutes();
        if (route == CudaGemmRoute::kCublas) {
          EXPECT_EQ(after.cublas_fallback - before.cublas_fallback,
                    kMicroBatches);
        } else {
          EXPECT_EQ(after.cublas_lt - before.cublas_lt, kMicroBatches)
              << "cuBLASLt found no algorithm for the weight-gradient GEMM";
        }
      }
    }
  }
}

// Operands that start at addresses aligned to their element size only
// (row views of odd-width matrices): cuBLASLt's algorithm must suit them,
// or the fallback runs.
TEST_F(CudaGemmTest, UnalignedOperands) {
  for (const DTypes& dt : kMixes) {
    for (CudaGemmRoute route : kRoutes) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dt.in), "->", DTypeName(dt.out), " ",
                                RouteName(route)));
      ScopedRoute scoped(route);
      const int64_t m = 19, n = 23, k = 29;
      const Tensor a_all = RandomHost({m + 1, k}, dt.in, 50);
      const Tensor b_all = RandomHost({k + 1, n}, dt.in, 51);
      const Tensor c_all = RandomHost({m + 1, n}, dt.out, 52);
      const Tensor a = *a_all.Slice(1, m + 1);
      const Tensor b = *b_all.Slice(1, k + 1);
      Tensor ch = (*c_all.Slice(1, m + 1)).Clone();
      const Tensor ad = *ToCuda(a_all).Slice(1, m + 1);
      const Tensor bd = *ToCuda(b_all).Slice(1, k + 1);
      const Tensor cd_all = ToCuda(c_all);
      Tensor cd = *cd_all.Slice(1, m + 1);
      const std::vector<double> c0 = Values(ch);
      ASSERT_TRUE(Gemm(a, false, b, false, &ch, 1.0f, 0.5f).ok());
      ASSERT_TRUE(Gemm(ad, false, bd, false, &cd, 1.0f, 0.5f).ok());
      const std::vector<double> want = Values(ch);
      EXPECT_TRUE(WithinBound(Values(cd), want,
                              Bound(Values(a), Values(b), c0, want, 0, false, m,
                                    n, k, false, false, 1.0f, 0.5f, dt.out)));
      // The row before the view is untouched.
      EXPECT_EQ(Values(*cd_all.Slice(0, 1)), Values(*c_all.Slice(0, 1)));
    }
  }
}

// fp32 GEMMs are true fp32 unless TF32 is allowed; allowed, each operand
// may be cut to TF32 (10 fraction bits; truncated, as the tensor-core
// instruction does with raw fp32 bits: relative error below 2^-10 each, so
// below 2^-9 per product beyond the fp32 bound). Besides random operands,
// every element 1 + 2^-12 (exact in fp32, 1 in TF32) makes TF32 visible:
// with k = 64 the exact and fp32 results are 64 + 2^-5, TF32's 64, while
// the fp32 bound is about 0.00074; so "off" must really be off.
TEST_F(CudaGemmTest, Tf32OnlyWhenAllowed) {
  EXPECT_FALSE(CudaGemmAllowsTf32());
  struct Operands {
    const char* name;
    Tensor a, b;
  };
  const float fine = 1.0f + std::ldexp(1.0f, -12);
  const Operands cases[] = {
      {"random", RandomHost({31, 513}, DType::kFloat32, 60),
       RandomHost({513, 47}, DType::kFloat32, 61)},
      {"1 + 2^-12", Tensor::Full({64, 64}, fine, DType::kFloat32),
       Tensor::Full({64, 64}, fine, DType::kFloat32)},
  };
  for (const Operands& c : cases) {
    const int64_t m = c.a.size(0), k = c.a.size(1), n = c.b.size(1);
    Tensor ch = Tensor::Zeros({m, n}, DType::kFloat32);
    ASSERT_TRUE(Gemm(c.a, false, c.b, false, &ch).ok());
    const std::vector<double> want = Values(ch);
    const std::vector<double> fp32 =
        Bound(Values(c.a), Values(c.b), want, want, 0, false, m, n, k, false,
              false, 1.0f, 0.0f, DType::kFloat32);
    // sum |a b| per element, from the fp32 bound's main term (over).
    std::vector<double> tf32 = fp32;
    for (size_t i = 0; i < tf32.size(); ++i) {
      tf32[i] += fp32[i] / (3 * k * kU32) * std::ldexp(1.0, -9);
    }
    for (bool allow : {false, true}) {
      SCOPED_TRACE(
          absl::StrCat(c.name, allow ? ", TF32 allowed" : ", TF32 off"));
      const bool previous = SetCudaGemmAllowTf32(allow);
      Tensor cd = Tensor::Zeros({m, n}, DType::kFloat32, KernelDevice());
      const absl::Status status =
          Gemm(ToCuda(c.a), false, ToCuda(c.b), false, &cd);
      SetCudaGemmAllowTf32(previous);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_TRUE(WithinBound(Values(cd), want, allow ? tf32 : fp32));
    }
  }
  EXPECT_FALSE(CudaGemmAllowsTf32());
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
