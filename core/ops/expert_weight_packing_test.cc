#include "core/ops/expert_weight_packing.h"

#include <cmath>
#include <vector>

#include "core/ops/gemm.h"
#include "core/ops/grouped_gemm.h"
#include "core/ops/test_util.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::Bytes;
using testing::RandomTensor;

// y = x op(w_g) + beta y0 per group in float64, and the bound of an fp32
// sum of those K + 1 terms in any order, plus one rounding of a 16-bit y
// (grouped_gemm_test's bound).
void ExpectNearFloat64(const Tensor& x, const Tensor& w, bool trans_w,
                       const std::vector<int64_t>& sizes, const Tensor& y0,
                       float beta, const Tensor& y, const char* what) {
  const std::vector<double> xd = x.ToDoubles(), wd = w.ToDoubles(),
                            y0d = y0.ToDoubles(), got = y.ToDoubles();
  const int64_t k = x.size(1), n = y.size(1);
  const double u32 = std::ldexp(1.0, -24);
  const double u_out = y.dtype() == DType::kFloat32 ? 0.0 : std::ldexp(1.0, -8);
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    for (int64_t r = row; r < row + sizes[g]; ++r) {
      for (int64_t j = 0; j < n; ++j) {
        double ref = beta * y0d[r * n + j], mag = std::fabs(ref);
        for (int64_t i = 0; i < k; ++i) {
          const double wv =
              trans_w ? wd[(g * n + j) * k + i] : wd[(g * k + i) * n + j];
          ref += xd[r * k + i] * wv;
          mag += std::fabs(xd[r * k + i] * wv);
        }
        const double tol = (k + 2) * u32 * mag + u_out * std::fabs(ref);
        ASSERT_NEAR(got[r * n + j], ref, tol)
            << what << " row " << r << " col " << j;
      }
    }
    row += sizes[g];
  }
}

bool PackedPathRuns(DType dtype, bool trans_w = true) {
  ScopedExpertWeightPacking scope;
  Tensor x = RandomTensor({4, 16}, dtype, 1);
  Tensor w = RandomTensor({1, 16, 16}, dtype, 2);
  Tensor y = Tensor::Empty({4, 16}, DType::kFloat32);
  EXPECT_TRUE(GroupedGemm(x, w, trans_w, {4}, &y).ok());
  return scope.packed_matrices() > 0;
}

struct Case {
  DType dtype;
  bool trans_w;
  DType out;
};

class ExpertWeightPackingTest : public ::testing::TestWithParam<Case> {};

// Forward and input gradient through the packs, uneven groups with an empty
// one, overwriting and accumulating, at 1 and 3 threads (3: the rows split
// across group boundaries, pieces of one group on two threads).
TEST_P(ExpertWeightPackingTest, MatchesFloat64) {
  const Case c = GetParam();
  const bool packed = PackedPathRuns(c.dtype, c.trans_w);
  if (!PackedPathRuns(c.dtype)) {
    GTEST_SKIP() << "no oneDNN brgemm kernel for this dtype on this CPU";
  }
  // fp32's data gradient is not packed; its results are checked the same.
  EXPECT_EQ(packed, c.dtype != DType::kFloat32 || c.trans_w);
  const std::vector<int64_t> sizes = {5, 0, 17, 1, 64, 128, 9};
  int64_t m = 0;
  for (int64_t s : sizes) m += s;
  const int64_t groups = sizes.size(), k = 40, n = 24;
  Tensor x = RandomTensor({m, k}, c.dtype, 3);
  Tensor w = RandomTensor(c.trans_w ? Shape{groups, n, k} : Shape{groups, k, n},
                          c.dtype, 4);
  Tensor y0 = RandomTensor({m, n}, c.out, 5);
  const int saved = ThreadPool::Global().num_threads();
  for (int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    ThreadPool::SetGlobalThreads(threads);
    ScopedExpertWeightPacking scope;
    for (float beta : {0.0f, 1.0f}) {
      Tensor y = y0.Clone();
      ASSERT_TRUE(GroupedGemm(x, w, c.trans_w, sizes, &y, beta).ok());
      ExpectNearFloat64(x, w, c.trans_w, sizes, y0, beta, y, "y");
    }
    // Every non-empty expert packed once, then reused.
    if (!packed) continue;
    EXPECT_EQ(scope.packed_matrices(), groups - 1);
    const int64_t elem = c.dtype == DType::kFloat32 ? 4 : 2;
    EXPECT_GE(scope.packed_bytes(), (groups - 1) * k * n * elem);
  }
  ThreadPool::SetGlobalThreads(saved);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ExpertWeightPackingTest,
    ::testing::Values(Case{DType::kFloat32, true, DType::kFloat32},
                      Case{DType::kFloat32, false, DType::kFloat32},
                      Case{DType::kBFloat16, true, DType::kFloat32},
                      Case{DType::kBFloat16, false, DType::kBFloat16}));

// Weights changed between two scopes (an optimizer step) are packed again:
// the second scope's result is the new weights' product, not the first's.
TEST(ExpertWeightPackingSingleTest, ChangedWeightsArePackedAgainNextScope) {
  if (!PackedPathRuns(DType::kFloat32)) GTEST_SKIP() << "no fp32 brgemm";
  const std::vector<int64_t> sizes = {32, 7, 64};
  const int64_t m = 103, k = 48, n = 32, groups = 3;
  Tensor x = RandomTensor({m, k}, DType::kFloat32, 6);
  Tensor w = RandomTensor({groups, n, k}, DType::kFloat32, 7);
  Tensor y = Tensor::Empty({m, n}, DType::kFloat32);
  std::vector<uint8_t> first;
  {
    ScopedExpertWeightPacking step;
    ASSERT_TRUE(GroupedGemm(x, w, true, sizes, &y).ok());
    first = Bytes(y);
  }
  // The update, in place (the optimizer writes the same storage).
  const Tensor updated = RandomTensor(w.shape(), DType::kFloat32, 8);
  ASSERT_TRUE(w.CopyFrom(updated).ok());
  {
    ScopedExpertWeightPacking step;
    ASSERT_TRUE(GroupedGemm(x, w, true, sizes, &y).ok());
    EXPECT_EQ(step.packed_matrices(), groups);
  }
  EXPECT_NE(Bytes(y), first);
  ExpectNearFloat64(x, updated, true, sizes, y, 0.0f, y, "after the update");
}

// Inside one scope the packs are reused: the contract is that the weights
// do not change there, and a change is not seen (this documents it, and
// fails if the packs were not used).
TEST(ExpertWeightPackingSingleTest, OneScopeReusesItsPacks) {
  if (!PackedPathRuns(DType::kFloat32)) GTEST_SKIP() << "no fp32 brgemm";
  const std::vector<int64_t> sizes = {16, 16};
  Tensor x = RandomTensor({32, 32}, DType::kFloat32, 9);
  Tensor w = RandomTensor({2, 32, 32}, DType::kFloat32, 10);
  Tensor y = Tensor::Empty({32, 32}, DType::kFloat32);
  ScopedExpertWeightPacking step;
  ASSERT_TRUE(GroupedGemm(x, w, true, sizes, &y).ok());
  const std::vector<uint8_t> first = Bytes(y);
  ASSERT_TRUE(w.CopyFrom(RandomTensor(w.shape(), DType::kFloat32, 11)).ok());
  ASSERT_TRUE(GroupedGemm(x, w, true, sizes, &y).ok());
  EXPECT_EQ(Bytes(y), first);
  EXPECT_EQ(step.packed_matrices(), 2);
  // fp32's other transposition (the data gradient) is not packed.
  Tensor dx = Tensor::Empty({32, 32}, DType::kFloat32);
  ASSERT_TRUE(GroupedGemm(x, w, false, sizes, &dx).ok());
  EXPECT_EQ(step.packed_matrices(), 2);
}

// An ended scope's buffers wait for the next scope (the next step), which
// takes them (and packs into them afresh: ChangedWeightsArePackedAgain...),
// until freed.
TEST(ExpertWeightPackingSingleTest, EndedScopesBuffersAreReusedUntilFreed) {
  if (!PackedPathRuns(DType::kFloat32)) GTEST_SKIP() << "no fp32 brgemm";
  FreeIdleExpertWeightPacks();
  EXPECT_EQ(IdleExpertWeightPackBytes(), 0);
  Tensor x = RandomTensor({48, 64}, DType::kFloat32, 14);
  Tensor w = RandomTensor({3, 32, 64}, DType::kFloat32, 15);
  Tensor y = Tensor::Empty({48, 32}, DType::kFloat32);
  {
    ScopedExpertWeightPacking step;
    ASSERT_TRUE(GroupedGemm(x, w, true, {16, 16, 16}, &y).ok());
    EXPECT_EQ(IdleExpertWeightPackBytes(), 0);
  }
  const int64_t idle = IdleExpertWeightPackBytes();
  EXPECT_EQ(idle, int64_t{2} << 20);  // One buffer, rounded up to 2 MiB.
  {
    ScopedExpertWeightPacking step;
    ASSERT_TRUE(GroupedGemm(x, w, true, {16, 16, 16}, &y).ok());
    EXPECT_EQ(IdleExpertWeightPackBytes(), 0);
  }
  EXPECT_EQ(IdleExpertWeightPackBytes(), idle);
  FreeIdleExpertWeightPacks();
  EXPECT_EQ(IdleExpertWeightPackBytes(), 0);
}

// A process that pinned bf16 GEMMs to the widened path keeps it: no bf16
// packs (they would run oneDNN's native kernels).
TEST(ExpertWeightPackingSingleTest, WidenedBf16PolicyPacksNothing) {
  if (!ExpertWeightPackingAvailable(DType::kBFloat16)) {
    GTEST_SKIP() << "no native bf16 brgemm on this CPU";
  }
  const Bf16PathPolicy saved =
      internal::SetBf16PathPolicyForTesting(Bf16PathPolicy::kWidened);
  EXPECT_FALSE(ExpertWeightPackingAvailable(DType::kBFloat16));
  EXPECT_FALSE(PackedPathRuns(DType::kBFloat16));
  internal::SetBf16PathPolicyForTesting(saved);
  EXPECT_TRUE(PackedPathRuns(DType::kBFloat16));
}

// Without a scope nothing is packed: the unpacked path's bits (one thread,
// so the group is one GEMM).
TEST(ExpertWeightPackingSingleTest, NoScopeIsTheUnpackedPath) {
  const int saved = ThreadPool::Global().num_threads();
  ThreadPool::SetGlobalThreads(1);
  const std::vector<int64_t> sizes = {16, 40};
  Tensor x = RandomTensor({56, 32}, DType::kFloat32, 12);
  Tensor w = RandomTensor({2, 24, 32}, DType::kFloat32, 13);
  Tensor y = Tensor::Empty({56, 24}, DType::kFloat32);
  ASSERT_TRUE(GroupedGemm(x, w, true, sizes, &y).ok());
  Tensor yg = Tensor::Empty({40, 24}, DType::kFloat32);
  ASSERT_TRUE(Gemm(x.Slice(16, 56).value(), false,
                   w.Slice(1, 2).value().Reshape({24, 32}).value(), true, &yg)
                  .ok());
  EXPECT_EQ(Bytes(y.Slice(16, 56).value()), Bytes(yg));
  ThreadPool::SetGlobalThreads(saved);
  { ScopedExpertWeightPacking inner; }
  EXPECT_EQ(internal::CurrentExpertWeightPacks(), nullptr);
}

}  // namespace
}  // namespace ops
}  // namespace mcc
