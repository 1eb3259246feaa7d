// The mixture-of-experts ops on CUDA tensors (//core/ops/cuda:registrations:
// moe_ops.h, grouped_gemm.h) against the CPU kernels and a float64
// reference, on the same random inputs. Skips without a CUDA device.
//
//  - Router, losses, expert bias: indices equal the CPU's (no near-ties in
//    these inputs), fp32 values within 1e-5 of the tensor's largest entry
//    (expf and the order of fp32 sums differ by a few ulps, and the softmax
//    backward's dot product nearly cancels).
//  - Sort and permutation: bit for bit; unpermute sums within 1e-6 of the
//    largest entry plus one 16-bit rounding.
//  - Grouped GEMM (fp32, bf16, fp16; both weight layouts; empty and skewed
//    groups; beta 0 and 1; each route): against the float64 product,
//    within 3 K u sum_l |x_il w_lj| + 2 u (|beta y0| + |y|) + one 16-bit
//    rounding of y (gemm_test's bound: u = 2^-24, accumulators that may
//    truncate), and bf16/fp16 weight gradients into fp32 likewise.
//  - Determinism: every op twice, the same bytes.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/ops/cuda/grouped_gemm.h"
#include "core/ops/cuda/test_util.h"
#include "core/ops/grouped_gemm.h"
#include "core/ops/moe_permute.h"
#include "core/ops/moe_router.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using testing::CudaTest;
using testing::kU32;
using testing::OnTestDevice;
using testing::OutputUlp;
using testing::RandomHost;
using testing::SameBytes;
using testing::ToCuda;
using testing::ToHost;
using testing::Values;
using testing::WithinBound;

// |got - want| <= rel * largest |want| + one 16-bit rounding of want.
::testing::AssertionResult Near(const Tensor& got, const Tensor& want,
                                double rel) {
  const std::vector<double> g = Values(got), w = Values(want);
  double largest = 0.0;
  for (double v : w) largest = std::max(largest, std::fabs(v));
  std::vector<double> bound(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    bound[i] = rel * largest + OutputUlp(want.dtype()) * std::fabs(w[i]);
  }
  return WithinBound(g, w, bound);
}

class MoeCudaTest : public CudaTest {};

MoeRouterOptions Options(int64_t k, MoeScoreFunction f, bool normalize) {
  MoeRouterOptions o;
  o.topk = k;
  o.score_function = f;
  o.normalize_topk = normalize;
  o.scaling_factor = 1.25f;
  return o;
}

TEST_F(MoeCudaTest, RouterAndLossesMatchTheCpuKernels) {
  const int64_t t = 96, e = 16, seqs = 4;
  for (MoeScoreFunction f :
       {MoeScoreFunction::kSoftmax, MoeScoreFunction::kSigmoid}) {
    for (bool normalize : {true, false}) {
      SCOPED_TRACE(::testing::Message()
                   << MoeScoreFunctionName(f) << " normalize " << normalize);
      const MoeRouterOptions o = Options(3, f, normalize);
      const Tensor logits = RandomHost({t, e}, DType::kFloat32, 1, -3, 3);
      const Tensor bias = RandomHost({e}, DType::kFloat32, 2, -0.05f, 0.05f);
      struct Out {
        Tensor scores, indices, weights, dlogits, aux, z;
      };
      auto run = [&](const Device& dev) {
        Out out;
        const Tensor l = *logits.To(dev), b = *bias.To(dev);
        out.scores = Tensor::Empty({t, e}, DType::kFloat32, dev);
        out.indices = Tensor::Empty({t, 3}, DType::kInt32, dev);
        out.weights = Tensor::Empty({t, 3}, DType::kFloat32, dev);
        EXPECT_TRUE(
            MoeRouterForward(l, &b, o, &out.scores, &out.indices, &out.weights)
                .ok());
        out.aux = Tensor::Empty({1}, DType::kFloat32, dev);
        out.z = Tensor::Empty({1}, DType::kFloat32, dev);
        EXPECT_TRUE(MoeLoadBalancingLoss(out.scores, out.indices, f, seqs,
                                         0.01f, &out.aux)
                        .ok());
        EXPECT_TRUE(MoeZLoss(l, 1e-3f, &out.z).ok());
        const Tensor dw = *RandomHost({t, 3}, DType::kFloat32, 3).To(dev);
        out.dlogits = Tensor::Empty({t, e}, DType::kFloat32, dev);
        EXPECT_TRUE(
            MoeRouterBackward(out.scores, out.indices, dw, o, &out.dlogits)
                .ok());
        EXPECT_TRUE(MoeLoadBalancingLossBackward(out.scores, out.indices, f,
                                                 seqs, 0.01f, 0.5f,
                                                 &out.dlogits)
                        .ok());
        EXPECT_TRUE(MoeZLossBackward(l, 1e-3f, 0.5f, &out.dlogits).ok());
        return out;
      };
      const Out cpu = run(Device::CPU());
      const Out dev = run(testing::KernelDevice());
      EXPECT_TRUE(SameBytes(dev.indices, cpu.indices));
      EXPECT_TRUE(Near(dev.scores, cpu.scores, 1e-6));
      EXPECT_TRUE(Near(dev.weights, cpu.weights, 1e-6));
      EXPECT_TRUE(Near(dev.aux, cpu.aux, 1e-6));
      EXPECT_TRUE(Near(dev.z, cpu.z, 1e-6));
      EXPECT_TRUE(Near(dev.dlogits, cpu.dlogits, 1e-5));
      const Out again = run(testing::KernelDevice());
      EXPECT_TRUE(SameBytes(again.dlogits, dev.dlogits));
      EXPECT_TRUE(SameBytes(again.aux, dev.aux));
    }
  }
}

TEST_F(MoeCudaTest, ExpertBiasMatchesTheCpuKernel) {
  const Tensor counts =
      *Tensor::FromInts({5, 9, 7, 7, 0, 14}, {6}, DType::kInt64);
  Tensor cpu = RandomHost({6}, DType::kFloat32, 4, -0.1f, 0.1f);
  Tensor dev = ToCuda(cpu);
  ASSERT_TRUE(MoeUpdateExpertBias(counts, 0.01f, &cpu).ok());
  ASSERT_TRUE(MoeUpdateExpertBias(ToCuda(counts), 0.01f, &dev).ok());
  EXPECT_TRUE(SameBytes(dev, cpu));
}

// k distinct random experts per token; expert 2 gets none.
Tensor RandomIndices(int64_t tokens, int64_t k, int64_t experts,
                     uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int64_t> v;
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<int64_t> e;
    for (int64_t x = 0; x < experts; ++x) {
      if (x != 2) e.push_back(x);
    }
    std::shuffle(e.begin(), e.end(), gen);
    v.insert(v.end(), e.begin(), e.begin() + k);
  }
  return *Tensor::FromInts(v, {tokens, k}, DType::kInt32);
}

class MoePermuteCudaTest : public CudaTest,
                           public ::testing::WithParamInterface<DType> {};

TEST_P(MoePermuteCudaTest, SortAndPermutationsMatchTheCpuKernels) {
  const DType dt = GetParam();
  // 1500 slots: several chunks of the sort's 256-thread scan.
  const int64_t tokens = 750, k = 2, experts = 9, h = 40, rows = tokens * k;
  const Tensor indices = RandomIndices(tokens, k, experts, 5);
  const Tensor x = RandomHost({tokens, h}, dt, 6);
  const Tensor out = RandomHost({rows, h}, dt, 7);
  const Tensor dy = RandomHost({tokens, h}, dt, 8);
  const Tensor weights = RandomHost({tokens, k}, DType::kFloat32, 9, 0, 1);
  struct Res {
    Tensor r2s, s2r, counts, permuted, y, dout, dweights, dx;
  };
  auto run = [&](const Device& d) {
    Res r;
    r.r2s = Tensor::Empty({rows}, DType::kInt32, d);
    r.s2r = Tensor::Empty({rows}, DType::kInt32, d);
    r.counts = Tensor::Empty({experts}, DType::kInt64, d);
    EXPECT_TRUE(
        MoeSortTokens(*indices.To(d), experts, &r.r2s, &r.s2r, &r.counts).ok());
    r.permuted = Tensor::Empty({rows, h}, dt, d);
    EXPECT_TRUE(MoePermute(*x.To(d), r.r2s, &r.permuted).ok());
    const Tensor w = *weights.To(d), o = *out.To(d);
    r.y = Tensor::Empty({tokens, h}, dt, d);
    EXPECT_TRUE(MoeUnpermute(o, r.s2r, &w, &r.y).ok());
    r.dout = Tensor::Empty({rows, h}, dt, d);
    r.dweights = Tensor::Empty({tokens, k}, DType::kFloat32, d);
    EXPECT_TRUE(
        MoeUnpermuteBackward(*dy.To(d), o, r.s2r, &w, &r.dout, &r.dweights)
            .ok());
    r.dx = Tensor::Empty({tokens, h}, dt, d);
    EXPECT_TRUE(MoePermuteBackward(r.dout, r.s2r, &r.dx).ok());
    return r;
  };
  const Res cpu = run(Device::CPU());
  const Res dev = run(testing::KernelDevice());
  EXPECT_TRUE(SameBytes(dev.r2s, cpu.r2s));
  EXPECT_TRUE(SameBytes(dev.s2r, cpu.s2r));
  EXPECT_TRUE(SameBytes(dev.counts, cpu.counts));
  EXPECT_TRUE(SameBytes(dev.permuted, cpu.permuted));
  EXPECT_TRUE(SameBytes(dev.dout, cpu.dout));
  EXPECT_TRUE(Near(dev.y, cpu.y, 1e-6));
  EXPECT_TRUE(Near(dev.dx, cpu.dx, 1e-6));
  EXPECT_TRUE(Near(dev.dweights, cpu.dweights, 1e-6));
  const Res again = run(testing::KernelDevice());
  EXPECT_TRUE(SameBytes(again.y, dev.y));
  EXPECT_TRUE(SameBytes(again.dweights, dev.dweights));
  EXPECT_TRUE(SameBytes(again.dx, dev.dx));
}

INSTANTIATE_TEST_SUITE_P(DTypes, MoePermuteCudaTest,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16,
                                           DType::kFloat16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// The float64 reference of y = x op(w) + beta y0 per group and its bound.
void GroupedReference(const std::vector<double>& x,
                      const std::vector<double>& w,
                      const std::vector<double>& y0, bool trans_w,
                      const std::vector<int64_t>& sizes, int64_t k, int64_t n,
                      float beta, DType out, std::vector<double>* want,
                      std::vector<double>* bound) {
  const int64_t m = static_cast<int64_t>(y0.size()) / n;
  want->assign(m * n, 0.0);
  bound->assign(m * n, 0.0);
  int64_t row = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    const double* wg = &w[g * k * n];
    for (int64_t i = row; i < row + sizes[g]; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0.0, abs_dot = 0.0;
        for (int64_t l = 0; l < k; ++l) {
          const double p =
              x[i * k + l] * (trans_w ? wg[j * k + l] : wg[l * n + j]);
          dot += p;
          abs_dot += std::fabs(p);
        }
        const double c0 = beta * y0[i * n + j];
        const double v = dot + c0;
        (*want)[i * n + j] = v;
        (*bound)[i * n + j] = 3.0 * k * kU32 * abs_dot +
                              2.0 * kU32 * (std::fabs(c0) + std::fabs(v)) +
                              OutputUlp(out) * std::fabs(v) + 1e-30;
      }
    }
    row += sizes[g];
  }
}

struct GroupedCase {
  DType in, out;
  bool trans_w;
  float beta;
};

class GroupedGemmCudaTest : public CudaTest {
 protected:
  void TearDown() override {
    internal::SetGroupedGemmRouteForTesting(internal::GroupedGemmRoute::kAuto);
  }
};

TEST_F(GroupedGemmCudaTest, MatchesTheFloat64Product) {
  const std::vector<int64_t> sizes = {5, 0, 37, 1, 0, 64, 3};
  const int64_t groups = static_cast<int64_t>(sizes.size());
  const int64_t m = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  const int64_t k = 48, n = 24;
  const GroupedCase cases[] = {
      {DType::kFloat32, DType::kFloat32, true, 0.0f},
      {DType::kFloat32, DType::kFloat32, false, 1.0f},
      {DType::kBFloat16, DType::kBFloat16, true, 0.0f},
      {DType::kBFloat16, DType::kFloat32, false, 1.0f},
      {DType::kFloat16, DType::kFloat16, false, 0.0f},
      {DType::kFloat16, DType::kFloat32, true, 0.5f},
  };
  for (const GroupedCase& c : cases) {
    for (auto route : {internal::GroupedGemmRoute::kAuto,
                       internal::GroupedGemmRoute::kPerGroup,
                       internal::GroupedGemmRoute::kGrouped}) {
      if (route == internal::GroupedGemmRoute::kGrouped && c.in != c.out) {
        continue;  // The grouped call takes one dtype.
      }
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(c.in) << " -> " << DTypeName(c.out)
                   << " trans_w " << c.trans_w << " beta " << c.beta
                   << " route " << static_cast<int>(route));
      internal::SetGroupedGemmRouteForTesting(route);
      const Tensor x = RandomHost({m, k}, c.in, 10);
      const Tensor w = RandomHost(
          c.trans_w ? Shape{groups, n, k} : Shape{groups, k, n}, c.in, 11);
      const Tensor y0 = RandomHost({m, n}, c.out, 12);
      Tensor y = ToCuda(y0);
      ASSERT_TRUE(
          GroupedGemm(ToCuda(x), ToCuda(w), c.trans_w, sizes, &y, c.beta).ok());
      std::vector<double> want, bound;
      GroupedReference(x.ToDoubles(), w.ToDoubles(), y0.ToDoubles(), c.trans_w,
                       sizes, k, n, c.beta, c.out, &want, &bound);
      EXPECT_TRUE(WithinBound(Values(y), want, bound));
      Tensor again = ToCuda(y0);
      ASSERT_TRUE(
          GroupedGemm(ToCuda(x), ToCuda(w), c.trans_w, sizes, &again, c.beta)
              .ok());
      EXPECT_TRUE(SameBytes(again, y));

      // dw_g = x_g^T dy_g (or dy_g^T x_g), fp32, into dw0 * beta.
      const Tensor dy = RandomHost({m, n}, c.in, 13);
      const Shape dws = c.trans_w ? Shape{groups, n, k} : Shape{groups, k, n};
      const Tensor dw0 = RandomHost(dws, DType::kFloat32, 14);
      Tensor dw = ToCuda(dw0);
      const absl::Status st = GroupedGemmWeightGrad(
          ToCuda(x), ToCuda(dy), c.trans_w, sizes, &dw, c.beta);
      if (route == internal::GroupedGemmRoute::kGrouped &&
          c.in != DType::kFloat32 && !OnTestDevice()) {
        // Refused: the grouped call cannot write 16-bit operands' products
        // into the fp32 dw, and the per-group route is off.
        EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
        continue;
      }
      ASSERT_TRUE(st.ok()) << st;
      // As a grouped product over the transposed rows: per group, the
      // reduction runs over the group's rows.
      const std::vector<double> xv = x.ToDoubles(), dyv = dy.ToDoubles(),
                                d0 = dw0.ToDoubles();
      std::vector<double> dwant(d0.size()), dbound(d0.size());
      const int64_t rows_out = c.trans_w ? n : k, cols_out = c.trans_w ? k : n;
      int64_t row = 0;
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t i = 0; i < rows_out; ++i) {
          for (int64_t j = 0; j < cols_out; ++j) {
            double dot = 0.0, abs_dot = 0.0;
            for (int64_t r = row; r < row + sizes[g]; ++r) {
              const double p = c.trans_w ? dyv[r * n + i] * xv[r * k + j]
                                         : xv[r * k + i] * dyv[r * n + j];
              dot += p;
              abs_dot += std::fabs(p);
            }
            const int64_t at = (g * rows_out + i) * cols_out + j;
            const double c0 = c.beta * d0[at], v = dot + c0;
            dwant[at] = v;
            dbound[at] = 3.0 * std::max<int64_t>(sizes[g], 1) * kU32 * abs_dot +
                         2.0 * kU32 * (std::fabs(c0) + std::fabs(v)) + 1e-30;
          }
        }
        row += sizes[g];
      }
      EXPECT_TRUE(WithinBound(Values(dw), dwant, dbound));
    }
  }
  if (!OnTestDevice()) {
    const GroupedGemmRouteCounts routes = GroupedGemmRoutes();
    EXPECT_GT(routes.grouped, 0);
    EXPECT_GT(routes.per_group, 0);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
