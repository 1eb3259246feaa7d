// The CUDA kernels of CheckIndexRange (core/ops/index_check.h) and of
// AccumulateLossTotals and PackLossTotals (core/ops/loss_totals.h) against
// the CPU kernels. Both are exact: the index check returns the CPU's very
// status (the first offending id by flat index), and the loss totals are the
// same float64 operations in the same order, so their bits agree. Skips
// without a CUDA device (the *_on_test_device build runs it in CI; see
// test_util.h).
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/cuda/test_util.h"
#include "core/ops/index_check.h"
#include "core/ops/loss_totals.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using testing::CudaTest;
using testing::KernelDevice;
using testing::SameBytes;
using testing::ToCuda;

class CudaIndexCheckTest : public CudaTest {};

constexpr int64_t kVocab = 1000, kIgnore = -100;

std::vector<int64_t> RandomIds(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> dist(0, kVocab - 1);
  std::vector<int64_t> ids(n);
  for (int64_t& id : ids) id = dist(gen);
  for (int64_t i = 3; i < n; i += 7) ids[i] = kIgnore;
  return ids;
}

TEST_F(CudaIndexCheckTest, SameStatusAsCpu) {
  struct Bad {
    int64_t at, id;
  };
  const std::vector<std::vector<Bad>> cases = {
      {},                                  // Every id valid.
      {{17, kVocab}},                      // Just past the end.
      {{500, -5}, {17, 1234}, {900, -1}},  // The first by index is named.
      {{0, -101}},
      {{1030, std::numeric_limits<int64_t>::max()}},
  };
  for (DType dt : {DType::kInt32, DType::kInt64}) {
    for (int64_t n : {int64_t{1031}, int64_t{70001}}) {
      for (const std::vector<Bad>& bad : cases) {
        std::vector<int64_t> ids = RandomIds(n, 7);
        for (const Bad& b : bad) {
          // Int32 ids wrap as the tensor stores them.
          ids[b.at] = dt == DType::kInt32 ? static_cast<int32_t>(b.id) : b.id;
        }
        SCOPED_TRACE(absl::StrCat(DTypeName(dt), " n ", n, " with ", bad.size(),
                                  " bad"));
        const Tensor host = *Tensor::FromInts(ids, {n}, dt);
        const absl::Status cpu =
            CheckIndexRange(host, kVocab, kIgnore, "token id");
        const absl::Status dev =
            CheckIndexRange(ToCuda(host), kVocab, kIgnore, "token id");
        EXPECT_EQ(cpu.ok(), bad.empty()) << cpu;
        EXPECT_EQ(dev, cpu);
      }
    }
  }
}

class CudaLossTotalsTest : public CudaTest {};

// A loss sum as ops::LossSum writes it: sum and tokens as hi/lo pairs.
Tensor LossSumOf(double sum, double tokens) {
  const float sh = static_cast<float>(sum);
  const float th = static_cast<float>(tokens);
  return *Tensor::FromVector(
      {sh, static_cast<float>(sum - sh), th, static_cast<float>(tokens - th)},
      {4});
}

TEST_F(CudaLossTotalsTest, BitsAgreeWithCpu) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> loss(0.5, 11.0);
  for (int micro_batches : {1, 3, 8}) {
    SCOPED_TRACE(absl::StrCat(micro_batches, " micro-batches"));
    Tensor th = Tensor::Zeros({kLossTotalsSize}, DType::kFloat32);
    Tensor td =
        Tensor::Zeros({kLossTotalsSize}, DType::kFloat32, KernelDevice());
    for (int mb = 0; mb < micro_batches; ++mb) {
      // One micro-batch without tokens (adds 0 to the mean of means).
      const double tokens = mb == 1 ? 0.0 : 1 + 4093 * mb;
      const Tensor ls = LossSumOf(tokens * loss(gen), tokens);
      ASSERT_TRUE(AccumulateLossTotals(ls, micro_batches, &th).ok());
      ASSERT_TRUE(AccumulateLossTotals(ToCuda(ls), micro_batches, &td).ok());
      EXPECT_TRUE(SameBytes(td, th)) << "after micro-batch " << mb;
    }
    Tensor ph = Tensor::Empty({kPackedLossTotalsSize}, DType::kFloat32);
    Tensor pd =
        Tensor::Empty({kPackedLossTotalsSize}, DType::kFloat32, KernelDevice());
    ASSERT_TRUE(PackLossTotals(th, &ph).ok());
    ASSERT_TRUE(PackLossTotals(td, &pd).ok());
    EXPECT_TRUE(SameBytes(pd, ph));
  }
}

// An infinite loss is kept in the first part alone, on both sides.
TEST_F(CudaLossTotalsTest, InfiniteLoss) {
  Tensor th = Tensor::Zeros({kLossTotalsSize}, DType::kFloat32);
  Tensor td = Tensor::Zeros({kLossTotalsSize}, DType::kFloat32, KernelDevice());
  const Tensor ls = *Tensor::FromVector({INFINITY, 0.0f, 64.0f, 0.0f}, {4});
  ASSERT_TRUE(AccumulateLossTotals(ls, 2, &th).ok());
  ASSERT_TRUE(AccumulateLossTotals(ToCuda(ls), 2, &td).ok());
  EXPECT_TRUE(SameBytes(td, th));
  Tensor ph = Tensor::Empty({kPackedLossTotalsSize}, DType::kFloat32);
  Tensor pd =
      Tensor::Empty({kPackedLossTotalsSize}, DType::kFloat32, KernelDevice());
  ASSERT_TRUE(PackLossTotals(th, &ph).ok());
  ASSERT_TRUE(PackLossTotals(td, &pd).ok());
  // inf - inf in the pair's low half is NaN on both sides, with payloads
  // that may differ (x86 and CUDA make different default NaNs): compare
  // classes there.
  const std::vector<double> got = testing::Values(pd),
                            want = testing::Values(ph);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << i;
    } else {
      EXPECT_EQ(got[i], want[i]) << i;
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
