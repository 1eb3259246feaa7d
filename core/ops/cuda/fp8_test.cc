// ops::AbsMax and ops::Fp8Gemm on CUDA against the CPU kernels: the maximum
// bit for bit (zeros, infinities, NaN), and the FP8 GEMM within the
// contract's bound (core/ops/fp8_gemm.h) taken twice, since both sides sit
// within it of the exact sum over the same FP8 values, plus one rounding of
// a 16-bit c on each side. Skips without a CUDA device.
#include "core/fp8.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/abs_max.h"
#include "core/ops/cuda/fp8_lt_gemm.h"
#include "core/ops/cuda/lt_plan_cache.h"
#include "core/ops/cuda/test_util.h"
#include "core/ops/fp8_gemm.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using testing::CudaTest;
using testing::KernelDevice;
using testing::RandomHost;
using testing::SameBytes;
using testing::ToCuda;
using testing::Values;
using testing::WithinBound;

const DType kFloatTypes[] = {DType::kFloat32, DType::kBFloat16,
                             DType::kFloat16};

class CudaFp8Test : public CudaTest {};

TEST_F(CudaFp8Test, AbsMaxEqualsTheCpus) {
  for (DType dt : kFloatTypes) {
    for (int64_t n : {0, 1, 255, 256, 257, 100000, 1 << 20}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dt), " n=", n));
      std::vector<double> v = Values(RandomHost({n}, dt, 11, -5.0f, 5.0f));
      std::vector<float> f(v.begin(), v.end());
      for (int special = 0; special < 3; ++special) {
        if (n > 10 && special == 1) f[n - 3] = -INFINITY;
        if (n > 10 && special == 2) f[n / 2] = NAN;
        const Tensor x = *Tensor::FromVector(f, {n}, dt);
        Tensor mh = Tensor::Empty({1}, DType::kFloat32);
        Tensor md = Tensor::Empty({1}, DType::kFloat32, KernelDevice());
        ASSERT_TRUE(AbsMax(x, &mh).ok());
        ASSERT_TRUE(AbsMax(ToCuda(x), &md).ok());
        if (special == 2 && n > 10) {
          EXPECT_TRUE(std::isnan(Values(md)[0]));
        } else {
          EXPECT_TRUE(SameBytes(md, mh))
              << Values(md)[0] << " vs " << Values(mh)[0];
        }
      }
    }
  }
}

TEST_F(CudaFp8Test, GemmWithinTheContractsBound) {
  constexpr double u = 1.0 / (1 << 24);
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
  };
  const Case cases[] = {{64, 48, 96, false, true},
                        {37, 19, 130, false, false},
                        {128, 64, 32, true, false},
                        {1, 7, 1000, true, true}};
  // Both CUDA routes: cuBLASLt's FP8 matmul where it takes the case (E4M3 a
  // with K and N multiples of 16, on sm_89+), and the bf16-held path.
  // Hopper's FP8 tensor cores keep fewer accumulator bits between
  // cuBLASLt's promotions to fp32 (about 14 by DeepSeek-V3's report), so
  // the native route gets 2^-11 of sum |a8 b8| on top of fp32's bound.
  for (int native : {1, 0}) {
    const int previous = internal::SetFp8CublasLtForTesting(native);
    for (DType dt : kFloatTypes) {
      for (const Case& c : cases) {
        for (Fp8Format fa : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
          for (float beta : {0.0f, 1.0f}) {
            SCOPED_TRACE(absl::StrCat(DTypeName(dt), " ", c.m, "x", c.n, "x",
                                      c.k, " ta=", c.ta, " tb=", c.tb, " ",
                                      Fp8FormatName(fa), " beta=", beta,
                                      " native=", native));
            const Tensor a = RandomHost(
                c.ta ? Shape{c.k, c.m} : Shape{c.m, c.k}, dt, 1, -3.0f, 3.0f);
            const Tensor b = RandomHost(
                c.tb ? Shape{c.n, c.k} : Shape{c.k, c.n}, dt, 2, -0.5f, 0.5f);
            const float sa = 448.0f / 3.0f, sb = 57344.0f / 0.5f / 4.0f;
            const Tensor sa_h = *Tensor::FromVector({sa}, {1});
            const Tensor sb_h = *Tensor::FromVector({sb}, {1});
            const Tensor c0 = RandomHost({c.m, c.n}, dt, 3);
            Tensor ch = c0.Clone();
            Tensor cd = ToCuda(c0);
            const float alpha = 0.75f;
            ASSERT_TRUE(Fp8Gemm(a, c.ta, fa, sa_h, b, c.tb, Fp8Format::kE5M2,
                                sb_h, &ch, alpha, beta)
                            .ok());
            ASSERT_TRUE(Fp8Gemm(ToCuda(a), c.ta, fa, ToCuda(sa_h), ToCuda(b),
                                c.tb, Fp8Format::kE5M2, ToCuda(sb_h), &cd,
                                alpha, beta)
                            .ok());
            // sum |A8 B8| from the FP8 values, in float64.
            const std::vector<double> av = Values(a), bv = Values(b);
            const double gamma = c.k * u / (1 - c.k * u);
            const double unit_c =
                dt == DType::kFloat32
                    ? u
                    : (dt == DType::kBFloat16 ? 1.0 / 256 : 1.0 / 2048);
            const double dequant = std::fabs(alpha / (double(sa) * sb));
            const std::vector<double> want = Values(ch);
            const std::vector<double> c0v = Values(c0);
            std::vector<double> bound(want.size());
            for (int64_t i = 0; i < c.m; ++i) {
              for (int64_t j = 0; j < c.n; ++j) {
                double s = 0;
                for (int64_t p = 0; p < c.k; ++p) {
                  const double x = av[c.ta ? p * c.m + i : i * c.k + p];
                  const double y = bv[c.tb ? j * c.k + p : p * c.n + j];
                  s += std::fabs(
                      RoundToFp8(static_cast<float>(x) * sa, fa) *
                      RoundToFp8(static_cast<float>(y) * sb, Fp8Format::kE5M2));
                }
                const double w = want[i * c.n + j];
                bound[i * c.n + j] =
                    2 * (gamma + 3 * u) * dequant * s +
                    native * std::ldexp(2.0, -12) * dequant * s +
                    2 * u * std::fabs(beta * c0v[i * c.n + j]) +
                    2 * unit_c * std::fabs(w) + 1e-30;
              }
            }
            EXPECT_TRUE(WithinBound(Values(cd), want, bound));
          }
        }
      }
    }
    internal::SetFp8CublasLtForTesting(previous);
  }
}

// The cuBLASLt route builds a call's plan (descriptors, layouts, heuristic)
// once: the same shapes again hit the cached plan, with the same bytes out.
TEST_F(CudaFp8Test, ARepeatedGemmReusesItsCublasLtPlan) {
  const int device = KernelDevice().index;
  const int previous = internal::SetFp8CublasLtForTesting(1);
  const Tensor a = ToCuda(RandomHost({80, 64}, DType::kBFloat16, 4));
  const Tensor b = ToCuda(RandomHost({48, 64}, DType::kBFloat16, 5));
  const Tensor sa = ToCuda(*Tensor::FromVector({100.0f}, {1}));
  const Tensor sb = ToCuda(*Tensor::FromVector({1000.0f}, {1}));
  auto run = [&](Tensor* c) {
    return Fp8Gemm(a, false, Fp8Format::kE4M3, sa, b, true, Fp8Format::kE5M2,
                   sb, c, 1.0f, 0.0f);
  };
  Tensor c1 = ToCuda(RandomHost({80, 48}, DType::kBFloat16, 6));
  Tensor c2 = ToCuda(RandomHost({80, 48}, DType::kBFloat16, 7));
  const LtPlanCacheCounts before = internal::Fp8LtPlanCacheCounts(device);
  ASSERT_TRUE(run(&c1).ok());
  const LtPlanCacheCounts first = internal::Fp8LtPlanCacheCounts(device);
  ASSERT_TRUE(run(&c2).ok());
  const LtPlanCacheCounts second = internal::Fp8LtPlanCacheCounts(device);
  internal::SetFp8CublasLtForTesting(previous);
  EXPECT_TRUE(SameBytes(c2, c1));
  if (first.misses + first.hits == before.misses + before.hits) {
    GTEST_SKIP() << "the cuBLASLt FP8 matmul does not run here (test device, "
                    "or no FP8 tensor cores)";
  }
  EXPECT_EQ(second.misses, first.misses);
  EXPECT_EQ(second.hits, first.hits + 1);
  EXPECT_LE(second.size, static_cast<int64_t>(internal::kFp8LtPlansPerDevice));
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
