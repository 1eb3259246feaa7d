#include "core/ops/reduce.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/ops/test_util.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::RandomTensor;

// Kahan-compensated float64 sums as the reference.
double KahanSum(const std::vector<double>& v, bool square) {
  double s = 0, c = 0;
  for (double x : v) {
    const double y = (square ? x * x : x) - c;
    const double t = s + y;
    c = (t - s) - y;
    s = t;
  }
  return s;
}

TEST(ReduceTest, MatchesFloat64Reference) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t n : {1, 7, 33, 129, 1000003}) {
      // Offset values so the sum does not cancel to ~0.
      Tensor x = RandomTensor({n}, dt, static_cast<uint32_t>(n), -0.5f, 1.0f);
      const std::vector<double> v = x.ToDoubles();
      // float64 accumulation of n terms: relative error <= n * 2^-53.
      const double rel = (n + 10) * std::ldexp(1.0, -53);
      const double sum = Sum(x).value(), ssq = SumOfSquares(x).value();
      const double want_sum = KahanSum(v, false), want_ssq = KahanSum(v, true);
      double abs_sum = 0;
      for (double e : v) abs_sum += std::fabs(e);
      EXPECT_NEAR(sum, want_sum, rel * abs_sum) << n;
      EXPECT_NEAR(ssq, want_ssq, rel * want_ssq) << n;
      EXPECT_NEAR(L2Norm(x).value(), std::sqrt(want_ssq),
                  rel * std::sqrt(want_ssq))
          << n;
    }
  }
}

TEST(ReduceTest, EmptyAndIndependentOfThreadCount) {
  EXPECT_EQ(Sum(Tensor::Zeros({0}, DType::kFloat32)).value(), 0.0);
  Tensor x = RandomTensor({3000017}, DType::kFloat32, 5);
  const int threads = ThreadPool::Global().num_threads();
  ThreadPool::SetGlobalThreads(1);
  const double a = SumOfSquares(x).value();
  ThreadPool::SetGlobalThreads(std::max(2, threads));
  const double b = SumOfSquares(x).value();
  ThreadPool::SetGlobalThreads(threads);
  EXPECT_EQ(a, b);
}

TEST(ReduceTest, NonFiniteElementsShow) {
  Tensor x = RandomTensor({100000}, DType::kFloat32, 6);
  x.data<float>()[77777] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(SumOfSquares(x).value()));
  x.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(L2Norm(x).value()));
}

TEST(ReduceTest, BadInputs) {
  Tensor ints = Tensor::Zeros({4, 2}, DType::kInt64);
  absl::StatusOr<double> s = Sum(ints);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("int64[4, 2]"), std::string::npos)
      << s.status();
  Tensor cx = testing::FakeCudaTensor({4}, DType::kFloat32);
  EXPECT_EQ(Sum(cx).status().code(), absl::StatusCode::kUnimplemented);
}

TEST(ReduceTestDevice, MatchesCpuBitForBit) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    Tensor x = RandomTensor({100003}, dt, 7);
    Tensor d = *x.To(Device::TestDevice());
    EXPECT_EQ(*Sum(d), *Sum(x));
    EXPECT_EQ(*SumOfSquares(d), *SumOfSquares(x));
    EXPECT_EQ(*L2Norm(d), *L2Norm(x));
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
