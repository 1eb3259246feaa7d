// The CUDA kernel of MergeAttentionPartial against the CPU kernel on the
// same random partial results. The registration check runs everywhere; the
// comparison skips without a CUDA device.
#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/cuda/test_util.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "parallel/context_parallel/softmax_merge.h"

namespace mcc {
namespace context_parallel {
namespace {

using ops::cuda::testing::CudaTest;
using ops::cuda::testing::kU32;
using ops::cuda::testing::RandomFloats;
using ops::cuda::testing::ToCuda;
using ops::cuda::testing::Values;
using ops::cuda::testing::WithinBound;

TEST(SoftmaxMergeCudaRegistrationTest, SlotHoldsACudaKernel) {
  EXPECT_TRUE(MergeAttentionPartialKernels().Get(Device::CUDA(0)).ok());
}

class SoftmaxMergeCudaTest : public CudaTest {};

// Bound per element: each side computes exp(l1 - l) o1 + exp(l2 - l) o2
// with l = max + log1p(exp(min - max)); exp and log are within 4 ulp on
// both (CUDA's expf/log1pf are within 2, the CPU's vector exp within 4),
// and the few roundings add a handful of u: each side is within 12 u of
// the exact value relative to |w1 o1| + |w2 o2| (and |l| + 1 for lse), so
// they differ by at most 24 u of it; 32 u leaves margin.
TEST_F(SoftmaxMergeCudaTest, MatchesTheCpuKernel) {
  const int64_t b = 2, s = 17, h = 3, d = 80;
  const Shape out_shape{b, s, h, d}, lse_shape{b, h, s};
  const int64_t rows = b * h * s;
  std::vector<float> lse1 = RandomFloats(rows, 1, -3, 3);
  std::vector<float> lse2 = RandomFloats(rows, 2, -3, 3);
  // Rows that have seen no keys yet on one side, and on both.
  const float inf = std::numeric_limits<float>::infinity();
  lse1[0] = -inf;
  lse2[1] = -inf;
  lse1[2] = lse2[2] = -inf;
  std::vector<float> o1 = RandomFloats(b * s * h * d, 3);
  std::vector<float> o2 = RandomFloats(b * s * h * d, 4);
  for (int64_t e = 0; e < d; ++e) {           // A -inf row's output is zero.
    o1[(0 * s + 0) * h * d + 0 * d + e] = 0;  // lse [b=0, h=0, s=0]
  }
  auto host = [](const std::vector<float>& v, const Shape& shape) {
    return *Tensor::FromVector(v, shape, DType::kFloat32);
  };
  Tensor cpu_out = host(o1, out_shape), cpu_lse = host(lse1, lse_shape);
  const Tensor part_out = host(o2, out_shape), part_lse = host(lse2, lse_shape);
  Tensor gpu_out = ToCuda(cpu_out), gpu_lse = ToCuda(cpu_lse);
  ASSERT_TRUE(MergeAttentionPartial(ToCuda(part_out), ToCuda(part_lse),
                                    &gpu_out, &gpu_lse)
                  .ok());
  ASSERT_TRUE(
      MergeAttentionPartial(part_out, part_lse, &cpu_out, &cpu_lse).ok());

  std::vector<double> out_bound(b * s * h * d), lse_bound(rows);
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t si = 0; si < s; ++si) {
      for (int64_t hi = 0; hi < h; ++hi) {
        const int64_t row = (bi * h + hi) * s + si;
        const double l1 = lse1[row], l2 = lse2[row];
        const double m = std::max(l1, l2);
        const double l =
            std::isinf(m) ? m
                          : m + std::log(std::exp(l1 - m) + std::exp(l2 - m));
        const double w1 = std::isinf(l1) ? 0 : std::exp(l1 - l);
        const double w2 = std::isinf(l2) ? 0 : std::exp(l2 - l);
        lse_bound[row] = 32 * kU32 * (std::isinf(l) ? 0 : std::fabs(l) + 1);
        for (int64_t e = 0; e < d; ++e) {
          const int64_t i = ((bi * s + si) * h + hi) * d + e;
          out_bound[i] =
              32 * kU32 * (w1 * std::fabs(o1[i]) + w2 * std::fabs(o2[i]));
        }
      }
    }
  }
  // Equal values (the -inf of a row with no keys on either side) match
  // exactly; WithinBound would see inf - inf.
  std::vector<double> got_lse = Values(gpu_lse), want_lse = Values(cpu_lse);
  for (size_t i = 0; i < got_lse.size(); ++i) {
    if (got_lse[i] == want_lse[i]) got_lse[i] = want_lse[i] = 0;
  }
  EXPECT_TRUE(WithinBound(got_lse, want_lse, lse_bound));
  EXPECT_TRUE(WithinBound(Values(gpu_out), Values(cpu_out), out_bound));
}

}  // namespace
}  // namespace context_parallel
}  // namespace mcc
