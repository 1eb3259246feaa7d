#include "core/ops/grouped_gemm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/gemm.h"
#include "core/ops/test_util.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::Bytes;
using testing::RandomTensor;

double UnitRoundoff(DType d) {
  return d == DType::kBFloat16  ? std::ldexp(1.0, -8)
         : d == DType::kFloat16 ? std::ldexp(1.0, -11)
                                : std::ldexp(1.0, -24);
}

// A GEMM whose products are exact in fp32 (16-bit operands have at most 11
// significant bits; fp32 products round once) and whose K-term sum runs in
// fp32 in any order is within K u32 sum_k |a b| of the exact value (the
// worst-case bound of any summation order), plus one rounding u_out |c| of
// a 16-bit output.
void ExpectGemmNear(const std::vector<double>& got,
                    const std::vector<double>& ref,
                    const std::vector<double>& mag, int64_t k, DType out,
                    const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  const double u32 = std::ldexp(1.0, -24);
  const double u_out = UnitRoundoff(out);
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = (k + 1) * u32 * mag[i] + u_out * std::fabs(ref[i]);
    ASSERT_NEAR(got[i], ref[i], tol) << what << "[" << i << "]";
  }
}

struct Case {
  DType dtype;
  bool trans_w;
};

class GroupedGemmTest : public ::testing::TestWithParam<Case> {};

void CheckAgainstFloat64(DType dt, bool tw, std::vector<int64_t> sizes) {
  int64_t m = 0;
  for (int64_t s : sizes) m += s;
  const int64_t groups = sizes.size(), k = 24, n = 13;
  Tensor x = RandomTensor({m, k}, dt, 1);
  Tensor w =
      RandomTensor(tw ? Shape{groups, n, k} : Shape{groups, k, n}, dt, 2);
  Tensor dy = RandomTensor({m, n}, dt, 3);
  const std::vector<double> xd = x.ToDoubles(), wd = w.ToDoubles(),
                            dyd = dy.ToDoubles();
  std::vector<int64_t> group_of(m);
  for (int64_t g = 0, r = 0; g < groups; ++g) {
    for (int64_t i = 0; i < sizes[g]; ++i) group_of[r++] = g;
  }
  // w_g[i][j] of the [K, N] matrix op(w_g).
  auto wv = [&](int64_t g, int64_t i, int64_t j) {
    return tw ? wd[(g * n + j) * k + i] : wd[(g * k + i) * n + j];
  };

  // y = x op(w_g), in fp32 and in the input dtype.
  for (DType out : {DType::kFloat32, dt}) {
    Tensor y = Tensor::Empty({m, n}, out);
    ASSERT_TRUE(GroupedGemm(x, w, tw, sizes, &y).ok());
    std::vector<double> ref(m * n), mag(m * n);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t i = 0; i < k; ++i) {
          const double p = xd[r * k + i] * wv(group_of[r], i, j);
          ref[r * n + j] += p;
          mag[r * n + j] += std::fabs(p);
        }
      }
    }
    ExpectGemmNear(y.ToDoubles(), ref, mag, k, out, "y");
  }

  // dx = dy op(w_g)^T.
  Tensor dx = Tensor::Empty({m, k}, dt);
  ASSERT_TRUE(GroupedGemm(dy, w, !tw, sizes, &dx).ok());
  {
    std::vector<double> ref(m * k), mag(m * k);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t i = 0; i < k; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const double p = dyd[r * n + j] * wv(group_of[r], i, j);
          ref[r * k + i] += p;
          mag[r * k + i] += std::fabs(p);
        }
      }
    }
    ExpectGemmNear(dx.ToDoubles(), ref, mag, n, dt, "dx");
  }

  // dw_g (fp32) accumulated onto a previous gradient (beta = 1); the empty
  // group keeps its previous value exactly.
  Tensor dw0 = RandomTensor(w.shape(), DType::kFloat32, 4);
  Tensor dw = dw0.Clone();
  ASSERT_TRUE(GroupedGemmWeightGrad(x, dy, tw, sizes, &dw).ok());
  const std::vector<double> dw0d = dw0.ToDoubles();
  std::vector<double> ref(dw0d), mag(dw0d.size());
  for (double& v : mag) v = 0;
  for (int64_t r = 0; r < m; ++r) {
    const int64_t g = group_of[r];
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const int64_t at = tw ? (g * n + j) * k + i : (g * k + i) * n + j;
        const double p = xd[r * k + i] * dyd[r * n + j];
        ref[at] += p;
        mag[at] += std::fabs(p);
      }
    }
  }
  for (size_t i = 0; i < mag.size(); ++i) mag[i] += std::fabs(dw0d[i]);
  // At most the largest group's rows plus the previous value.
  const int64_t terms = *std::max_element(sizes.begin(), sizes.end()) + 1;
  ExpectGemmNear(dw.ToDoubles(), ref, mag, terms, DType::kFloat32, "dw");
  const int64_t per_group = k * n;
  const std::vector<double> dwd = dw.ToDoubles();
  for (int64_t i = per_group; i < 2 * per_group; ++i) {
    ASSERT_EQ(dwd[i], dw0d[i]) << "empty group's dw changed at " << i;
  }
  // beta = 0 overwrites, zeroing the empty group.
  ASSERT_TRUE(GroupedGemmWeightGrad(x, dy, tw, sizes, &dw, 0.0f).ok());
  const std::vector<double> over = dw.ToDoubles();
  for (int64_t i = per_group; i < 2 * per_group; ++i) ASSERT_EQ(over[i], 0.0);
}

TEST_P(GroupedGemmTest, ForwardAndBackwardMatchFloat64) {
  // Uneven groups, one empty, one of a single row.
  CheckAgainstFloat64(GetParam().dtype, GetParam().trans_w, {5, 0, 17, 1, 9});
}

// With several threads the forward splits the rows evenly over them, across
// group boundaries, and the weight gradient shares out whole groups (with
// at least twice as many groups as threads): the same bounds at 1, 3 and 4
// threads, with skewed sizes and empty groups.
TEST_P(GroupedGemmTest, EveryThreadCountMatchesFloat64) {
  const int saved = ThreadPool::Global().num_threads();
  for (int threads : {1, 3, 4}) {
    SCOPED_TRACE(threads);
    ThreadPool::SetGlobalThreads(threads);
    CheckAgainstFloat64(GetParam().dtype, GetParam().trans_w,
                        {1, 0, 2, 3, 0, 5, 8, 13, 21, 0});
  }
  ThreadPool::SetGlobalThreads(saved);
}

INSTANTIATE_TEST_SUITE_P(Cases, GroupedGemmTest,
                         ::testing::Values(Case{DType::kFloat32, false},
                                           Case{DType::kFloat32, true},
                                           Case{DType::kBFloat16, false},
                                           Case{DType::kBFloat16, true},
                                           Case{DType::kFloat16, true}));

// Each group is one ordinary GEMM: the grouped result equals Gemm on that
// group's rows bit for bit.
TEST(GroupedGemmSingleTest, EachGroupIsTheDenseGemm) {
  const std::vector<int64_t> sizes = {40, 24};
  Tensor x = RandomTensor({64, 32}, DType::kBFloat16, 5);
  Tensor w = RandomTensor({2, 48, 32}, DType::kBFloat16, 6);
  Tensor y = Tensor::Empty({64, 48}, DType::kFloat32);
  ASSERT_TRUE(GroupedGemm(x, w, true, sizes, &y).ok());
  Tensor w1 = w.Slice(1, 2).value().Reshape({48, 32}).value();
  Tensor y1 = Tensor::Empty({24, 48}, DType::kFloat32);
  ASSERT_TRUE(Gemm(x.Slice(40, 64).value(), false, w1, true, &y1).ok());
  EXPECT_EQ(Bytes(y.Slice(40, 64).value()), Bytes(y1));
}

// Groups of few rows, whose weights and fp32 gradients the CPU kernel reads
// into cache first, still give each group's ordinary GEMM bit for bit:
// forward, input gradient, and the weight gradient accumulated into dw.
// On one thread, so that each group is one GEMM: on more, a group's rows
// split at the threads' row boundaries, and oneDNN's AVX2 kernels (not its
// AVX-512 ones) round a row differently with the number of rows beside it
// (seen under ONEDNN_MAX_CPU_ISA=AVX2).
TEST(GroupedGemmSingleTest, SmallGroupsAreTheDenseGemmsBitForBit) {
  struct OneThread {
    int threads = ThreadPool::Global().num_threads();
    OneThread() { ThreadPool::SetGlobalThreads(1); }
    ~OneThread() { ThreadPool::SetGlobalThreads(threads); }
  } one_thread;
  const std::vector<int64_t> sizes = {3, 64, 0, 17};
  const int64_t m = 84, k = 32, n = 48, groups = 4;
  Tensor x = RandomTensor({m, k}, DType::kFloat32, 7);
  Tensor w = RandomTensor({groups, n, k}, DType::kFloat32, 8);
  Tensor dy = RandomTensor({m, n}, DType::kFloat32, 9);
  Tensor dw = RandomTensor({groups, n, k}, DType::kFloat32, 10);
  Tensor dw0 = dw.Clone();
  Tensor y = Tensor::Empty({m, n}, DType::kFloat32);
  Tensor dx = Tensor::Empty({m, k}, DType::kFloat32);
  ASSERT_TRUE(GroupedGemm(x, w, true, sizes, &y).ok());
  ASSERT_TRUE(GroupedGemm(dy, w, false, sizes, &dx).ok());
  ASSERT_TRUE(GroupedGemmWeightGrad(x, dy, true, sizes, &dw, 1.0f).ok());
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t r = sizes[g];
    Tensor wg = w.Slice(g, g + 1).value().Reshape({n, k}).value();
    Tensor dwg = dw0.Slice(g, g + 1).value().Reshape({n, k}).value().Clone();
    if (r > 0) {
      Tensor xg = x.Slice(row, row + r).value();
      Tensor dyg = dy.Slice(row, row + r).value();
      Tensor yg = Tensor::Empty({r, n}, DType::kFloat32);
      Tensor dxg = Tensor::Empty({r, k}, DType::kFloat32);
      ASSERT_TRUE(Gemm(xg, false, wg, true, &yg).ok());
      ASSERT_TRUE(Gemm(dyg, false, wg, false, &dxg).ok());
      ASSERT_TRUE(Gemm(dyg, true, xg, false, &dwg, 1.0f, 1.0f).ok());
      EXPECT_EQ(Bytes(y.Slice(row, row + r).value()), Bytes(yg)) << g;
      EXPECT_EQ(Bytes(dx.Slice(row, row + r).value()), Bytes(dxg)) << g;
    }
    EXPECT_EQ(Bytes(dw.Slice(g, g + 1).value().Reshape({n, k}).value()),
              Bytes(dwg))
        << g;
    EXPECT_EQ(Bytes(w.Slice(g, g + 1).value().Reshape({n, k}).value()),
              Bytes(RandomTensor({groups, n, k}, DType::kFloat32, 8)
                        .Slice(g, g + 1)
                        .value()
                        .Reshape({n, k})
                        .value()))
        << "w of group " << g << " changed";
    row += r;
  }
}

// Expert row counts change every step; the bf16 path is measured once per
// power-of-two shape class, not at every new count (each measurement times
// both paths: several times the GEMM itself).
TEST(GroupedGemmSingleTest, Bf16PathIsMeasuredOncePerShapeClass) {
  if (!NativeBf16Available()) {
    GTEST_SKIP() << "no native bf16 GEMM on this CPU: bf16 always widens";
  }
  const Bf16PathPolicy saved =
      internal::SetBf16PathPolicyForTesting(Bf16PathPolicy::kAuto);
  internal::ClearBf16GemmChoicesForTesting();
  Tensor x = RandomTensor({1024, 128}, DType::kBFloat16, 1);
  Tensor w = RandomTensor({2, 128, 128}, DType::kBFloat16, 2);
  Tensor y = Tensor::Empty({1024, 128}, DType::kFloat32);
  Tensor dw = Tensor::Zeros({2, 128, 128}, DType::kFloat32);
  // Groups of 300 to 303 and 724 to 721 rows: classes 512 and 1024.
  for (int64_t d = 0; d < 4; ++d) {
    const std::vector<int64_t> sizes = {300 + d, 724 - d};
    ASSERT_TRUE(GroupedGemm(x, w, true, sizes, &y).ok());
    ASSERT_TRUE(GroupedGemmWeightGrad(x, y.To(DType::kBFloat16).value(), true,
                                      sizes, &dw)
                    .ok());
  }
  // Forward: (512, 128, 128) and (1024, 128, 128); weight gradient: the
  // row count is k, (128, 128, 512) and (128, 128, 1024).
  EXPECT_EQ(Bf16GemmChoices().size(), 4u);
  internal::ClearBf16GemmChoicesForTesting();
  internal::SetBf16PathPolicyForTesting(saved);
}

// New row counts reuse the native path's oneDNN primitives (one per n and
// transposes): a primitive per exact shape cost ~0.3 ms at every new count
// and stayed for the life of the process.
TEST(GroupedGemmSingleTest, NewRowCountsCreateNoBf16Primitives) {
  if (!NativeBf16Available()) {
    GTEST_SKIP() << "no native bf16 GEMM on this CPU: bf16 always widens";
  }
  const Bf16PathPolicy saved =
      internal::SetBf16PathPolicyForTesting(Bf16PathPolicy::kNative);
  Tensor x = RandomTensor({1024, 128}, DType::kBFloat16, 1);
  Tensor w = RandomTensor({2, 128, 128}, DType::kBFloat16, 2);
  Tensor y = Tensor::Empty({1024, 128}, DType::kBFloat16);
  Tensor dx = Tensor::Empty({1024, 128}, DType::kBFloat16);
  Tensor dw = Tensor::Zeros({2, 128, 128}, DType::kFloat32);
  int64_t after_first = 0;
  for (int64_t d = 0; d < 4; ++d) {
    const std::vector<int64_t> sizes = {300 + 7 * d, 724 - 7 * d};
    ASSERT_TRUE(GroupedGemm(x, w, true, sizes, &y).ok());
    ASSERT_TRUE(GroupedGemmWeightGrad(x, y, true, sizes, &dw).ok());
    ASSERT_TRUE(GroupedGemm(y, w, false, sizes, &dx).ok());
    if (d == 0) after_first = internal::MatmulPrimitivesCreated();
  }
  EXPECT_EQ(internal::MatmulPrimitivesCreated(), after_first);
  internal::SetBf16PathPolicyForTesting(saved);
}

// Both ops run through their slots on a device that is not the host, with
// the CPU's results bit for bit.
TEST(GroupedGemmSingleTest, SameOnTheTestDevice) {
  const std::vector<int64_t> sizes = {3, 0, 7};
  Tensor x = RandomTensor({10, 8}, DType::kBFloat16, 1);
  Tensor w = RandomTensor({3, 6, 8}, DType::kBFloat16, 2);
  Tensor dy = RandomTensor({10, 6}, DType::kBFloat16, 3);
  testing::ExpectSameOnTestDevice(
      {x, w, dy, Tensor::Zeros({10, 6}, DType::kBFloat16),
       RandomTensor({3, 6, 8}, DType::kFloat32, 4)},
      [&](std::vector<Tensor>& a) -> absl::Status {
        absl::Status s = GroupedGemm(a[0], a[1], true, sizes, &a[3]);
        if (s.ok()) s = GroupedGemmWeightGrad(a[0], a[2], true, sizes, &a[4]);
        return s;
      },
      "grouped GEMM");
}

TEST(GroupedGemmSingleTest, BadArgumentsAreNamedAndNothingIsWritten) {
  Tensor x = RandomTensor({10, 8}, DType::kFloat32, 1);
  Tensor w = RandomTensor({3, 8, 4}, DType::kFloat32, 2);
  Tensor y = Tensor::Zeros({10, 4}, DType::kFloat32);
  const auto before = Bytes(y);
  absl::Status s = GroupedGemm(x, w, false, {4, 4, 1}, &y);
  EXPECT_NE(s.message().find("group sizes sum to 9, not the 10 rows of x"),
            std::string::npos)
      << s;
  s = GroupedGemm(x, w, false, {10}, &y);
  EXPECT_NE(s.message().find("1 group sizes for 3 weight matrices"),
            std::string::npos)
      << s;
  s = GroupedGemm(x, w, true, {4, 4, 2}, &y);
  EXPECT_NE(s.message().find("differ in the inner dimension"),
            std::string::npos)
      << s;
  EXPECT_EQ(Bytes(y), before);
  Tensor dw = Tensor::Zeros({3, 4, 8}, DType::kFloat32);
  s = GroupedGemmWeightGrad(x, y, false, {4, 4, 2}, &dw);
  EXPECT_NE(s.message().find("dw fp32[3, 4, 8] must be [3, 8, 4]"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace ops
}  // namespace mcc
