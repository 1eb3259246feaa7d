#include "core/ops/moe_permute.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/ops/test_util.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::Bytes;
using testing::RandomTensor;

// Unit roundoff of each activation dtype (half an ulp, relative).
double UnitRoundoff(DType d) {
  return d == DType::kBFloat16  ? std::ldexp(1.0, -8)
         : d == DType::kFloat16 ? std::ldexp(1.0, -11)
                                : std::ldexp(1.0, -24);
}

// k distinct random experts per token (as a router chooses), int32.
Tensor RandomIndices(int64_t tokens, int64_t k, int64_t experts,
                     uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> v;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int64_t> e(experts);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), gen);
    v.insert(v.end(), e.begin(), e.begin() + k);
  }
  return Tensor::FromInts(v, {tokens, k}, DType::kInt32).value();
}

std::vector<int> Ints(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int>(p, p + t.numel());
}

struct Plan {
  Tensor row_to_slot, slot_to_row, counts;
};

Plan Sort(const Tensor& indices, int64_t experts) {
  const int64_t n = indices.numel();
  Plan p{Tensor::Empty({n}, DType::kInt32), Tensor::Empty({n}, DType::kInt32),
         Tensor::Empty({experts}, DType::kInt64)};
  EXPECT_TRUE(
      MoeSortTokens(indices, experts, &p.row_to_slot, &p.slot_to_row, &p.counts)
          .ok());
  return p;
}

TEST(MoePermuteTest, SortsByExpertThenTokenThenChoice) {
  const int64_t tokens = 50, k = 3, experts = 7;
  Tensor indices = RandomIndices(tokens, k, experts, 1);
  Plan p = Sort(indices, experts);
  // The reference: slots t * k + i stably sorted by expert (slot order is
  // token then choice).
  const std::vector<int> idx = Ints(indices);
  std::vector<int> want(tokens * k);
  std::iota(want.begin(), want.end(), 0);
  std::stable_sort(want.begin(), want.end(),
                   [&](int a, int b) { return idx[a] < idx[b]; });
  EXPECT_EQ(Ints(p.row_to_slot), want);
  const std::vector<int> s2r = Ints(p.slot_to_row);
  for (int64_t r = 0; r < tokens * k; ++r) EXPECT_EQ(s2r[want[r]], r);
  std::vector<double> counts(experts, 0);
  for (int e : idx) counts[e] += 1;
  EXPECT_EQ(p.counts.ToDoubles(), counts);
}

class MoePermuteDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(MoePermuteDTypeTest, ForwardAndBackwardMatchFloat64) {
  const DType dt = GetParam();
  const int64_t tokens = 37, k = 2, experts = 5, h = 19;
  Tensor indices = RandomIndices(tokens, k, experts, 2);
  Plan p = Sort(indices, experts);
  const std::vector<int> r2s = Ints(p.row_to_slot), s2r = Ints(p.slot_to_row);
  Tensor x = RandomTensor({tokens, h}, dt, 3);
  Tensor w = RandomTensor({tokens, k}, DType::kFloat32, 4, 0, 1);
  const std::vector<double> xd = x.ToDoubles(), wd = w.ToDoubles();
  const double u = UnitRoundoff(dt), u32 = std::ldexp(1.0, -24);

  // Permute is a copy: exact.
  Tensor permuted = Tensor::Empty({tokens * k, h}, dt);
  ASSERT_TRUE(MoePermute(x, p.row_to_slot, &permuted).ok());
  std::vector<double> want(tokens * k * h);
  for (int64_t r = 0; r < tokens * k; ++r) {
    for (int64_t j = 0; j < h; ++j) want[r * h + j] = xd[(r2s[r] / k) * h + j];
  }
  EXPECT_EQ(permuted.ToDoubles(), want);

  // Unpermute of "expert outputs" (random rows): k products and k sums in
  // fp32, then one rounding to dt: |err| <= (k + 1) u32 sum_i |w x| + u |y|.
  Tensor out = RandomTensor({tokens * k, h}, dt, 5);
  const std::vector<double> od = out.ToDoubles();
  Tensor y = Tensor::Empty({tokens, h}, dt);
  ASSERT_TRUE(MoeUnpermute(out, p.slot_to_row, &w, &y).ok());
  const std::vector<double> yd = y.ToDoubles();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < h; ++j) {
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double term = wd[t * k + i] * od[s2r[t * k + i] * h + j];
        ref += term;
        mag += std::fabs(term);
      }
      ASSERT_NEAR(yd[t * h + j], ref, (k + 1) * u32 * mag + u * std::fabs(ref))
          << "y[" << t << ", " << j << "]";
    }
  }

  // Backward of unpermute: dexpert_out = w dy (one product, one rounding),
  // dweights = <dy, expert_out> (float64 sums of exact products, rounded
  // once to fp32).
  Tensor dy = RandomTensor({tokens, h}, dt, 6);
  const std::vector<double> dyd = dy.ToDoubles();
  Tensor dout = Tensor::Empty({tokens * k, h}, dt);
  Tensor dw = Tensor::Empty({tokens, k}, DType::kFloat32);
  ASSERT_TRUE(
      MoeUnpermuteBackward(dy, out, p.slot_to_row, &w, &dout, &dw).ok());
  const std::vector<double> doutd = dout.ToDoubles(), dwd = dw.ToDoubles();
  for (int64_t s = 0; s < tokens * k; ++s) {
    double dot = 0;
    for (int64_t j = 0; j < h; ++j) {
      const double ref = wd[s] * dyd[(s / k) * h + j];
      ASSERT_NEAR(doutd[s2r[s] * h + j], ref, (u + u32) * std::fabs(ref));
      dot += dyd[(s / k) * h + j] * od[s2r[s] * h + j];
    }
    ASSERT_NEAR(dwd[s], dot, 2 * u32 * std::fabs(dot) + 1e-12) << s;
  }

  // Backward of permute: dx[t] = sum_i dpermuted[slot_to_row[t k + i]], k
  // sums in fp32 then one rounding.
  Tensor dperm = RandomTensor({tokens * k, h}, dt, 7);
  const std::vector<double> dpd = dperm.ToDoubles();
  Tensor dx = Tensor::Empty({tokens, h}, dt);
  ASSERT_TRUE(MoePermuteBackward(dperm, p.slot_to_row, &dx).ok());
  const std::vector<double> dxd = dx.ToDoubles();
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < h; ++j) {
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < k; ++i) {
        ref += dpd[s2r[t * k + i] * h + j];
        mag += std::fabs(dpd[s2r[t * k + i] * h + j]);
      }
      ASSERT_NEAR(dxd[t * h + j], ref, k * u32 * mag + u * std::fabs(ref));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(DTypes, MoePermuteDTypeTest,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16,
                                           DType::kFloat16));

// Every output of the four ops, as bytes.
std::vector<uint8_t> RunAll(const Tensor& indices, int64_t experts,
                            const Tensor& x, const Tensor& w, const Tensor& out,
                            const Tensor& dy) {
  const int64_t tokens = x.size(0), h = x.size(1), k = indices.size(1);
  Plan p = Sort(indices, experts);
  Tensor permuted = Tensor::Empty({tokens * k, h}, x.dtype());
  Tensor y = Tensor::Empty({tokens, h}, x.dtype());
  Tensor dout = Tensor::Empty({tokens * k, h}, x.dtype());
  Tensor dw = Tensor::Empty({tokens, k}, DType::kFloat32);
  Tensor dx = Tensor::Empty({tokens, h}, x.dtype());
  EXPECT_TRUE(MoePermute(x, p.row_to_slot, &permuted).ok());
  EXPECT_TRUE(MoeUnpermute(out, p.slot_to_row, &w, &y).ok());
  EXPECT_TRUE(
      MoeUnpermuteBackward(dy, out, p.slot_to_row, &w, &dout, &dw).ok());
  EXPECT_TRUE(MoePermuteBackward(out, p.slot_to_row, &dx).ok());
  std::vector<uint8_t> all;
  for (const Tensor* t : {&p.row_to_slot, &p.slot_to_row, &p.counts, &permuted,
                          &y, &dout, &dw, &dx}) {
    const std::vector<uint8_t> b = Bytes(*t);
    all.insert(all.end(), b.begin(), b.end());
  }
  return all;
}

TEST(MoePermuteTest, BitIdenticalAcrossRunsAndThreadCounts) {
  const int64_t tokens = 3000, k = 4, experts = 16, h = 96;
  Tensor indices = RandomIndices(tokens, k, experts, 9);
  Tensor x = RandomTensor({tokens, h}, DType::kBFloat16, 10);
  Tensor w = RandomTensor({tokens, k}, DType::kFloat32, 11, 0, 1);
  Tensor out = RandomTensor({tokens * k, h}, DType::kBFloat16, 12);
  Tensor dy = RandomTensor({tokens, h}, DType::kBFloat16, 13);
  const int threads = ThreadPool::Global().num_threads();
  ThreadPool::SetGlobalThreads(1);
  const auto one = RunAll(indices, experts, x, w, out, dy);
  ThreadPool::SetGlobalThreads(4);
  const auto four = RunAll(indices, experts, x, w, out, dy);
  const auto again = RunAll(indices, experts, x, w, out, dy);
  ThreadPool::SetGlobalThreads(threads);
  EXPECT_EQ(one, four);
  EXPECT_EQ(four, again);
}

// Every op runs through its slot on a device that is not the host, with
// the CPU's results bit for bit.
TEST(MoePermuteTest, SameOnTheTestDevice) {
  const int64_t tokens = 30, k = 2, experts = 5, h = 12;
  Tensor indices = RandomIndices(tokens, k, experts, 3);
  std::vector<Tensor> p = testing::ExpectSameOnTestDevice(
      {indices, Tensor::Zeros({tokens * k}, DType::kInt32),
       Tensor::Zeros({tokens * k}, DType::kInt32),
       Tensor::Zeros({experts}, DType::kInt64)},
      [&](std::vector<Tensor>& a) {
        return MoeSortTokens(a[0], experts, &a[1], &a[2], &a[3]);
      },
      "MoeSortTokens");
  Tensor x = RandomTensor({tokens, h}, DType::kBFloat16, 4);
  Tensor w = RandomTensor({tokens, k}, DType::kFloat32, 5);
  Tensor out = RandomTensor({tokens * k, h}, DType::kBFloat16, 6);
  Tensor dy = RandomTensor({tokens, h}, DType::kBFloat16, 7);
  testing::ExpectSameOnTestDevice(
      {x, p[1], p[2], w, out, dy,
       Tensor::Zeros({tokens * k, h}, DType::kBFloat16),
       Tensor::Zeros({tokens, h}, DType::kBFloat16),
       Tensor::Zeros({tokens * k, h}, DType::kBFloat16),
       Tensor::Zeros({tokens, k}, DType::kFloat32),
       Tensor::Zeros({tokens, h}, DType::kBFloat16)},
      [&](std::vector<Tensor>& a) -> absl::Status {
        absl::Status s = MoePermute(a[0], a[1], &a[6]);
        if (s.ok()) s = MoeUnpermute(a[4], a[2], &a[3], &a[7]);
        if (s.ok()) {
          s = MoeUnpermuteBackward(a[5], a[4], a[2], &a[3], &a[8], &a[9]);
        }
        if (s.ok()) s = MoePermuteBackward(a[4], a[2], &a[10]);
        return s;
      },
      "permute ops");
}

TEST(MoePermuteTest, BadArgumentsAreNamedAndNothingIsWritten) {
  Tensor bad = Tensor::FromInts({0, 1, 5, 2}, {2, 2}, DType::kInt32).value();
  Tensor r2s = Tensor::Zeros({4}, DType::kInt32);
  Tensor s2r = Tensor::Zeros({4}, DType::kInt32);
  Tensor counts = Tensor::Zeros({4}, DType::kInt64);
  const auto before = Bytes(r2s);
  absl::Status st = MoeSortTokens(bad, 4, &r2s, &s2r, &counts);
  EXPECT_NE(st.message().find("indices[2] = 5 is outside [0, 4)"),
            std::string::npos)
      << st;
  EXPECT_EQ(Bytes(r2s), before);
  Tensor x = RandomTensor({3, 8}, DType::kFloat32, 1);
  Tensor permuted = Tensor::Zeros({4, 8}, DType::kFloat32);
  st = MoePermute(x, r2s, &permuted);
  EXPECT_NE(st.message().find("4 permuted rows are not a whole number of "
                              "copies of 3 tokens"),
            std::string::npos)
      << st;
  Tensor y16 = Tensor::Zeros({2, 8}, DType::kBFloat16);
  st = MoeUnpermute(permuted, s2r, nullptr, &y16);
  EXPECT_NE(st.message().find("must have one dtype"), std::string::npos) << st;
}

}  // namespace
}  // namespace ops
}  // namespace mcc
