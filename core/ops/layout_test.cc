#include "core/ops/layout.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/ops/test_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectSameOnTestDevice;
using testing::RandomTensor;

// Distinct integer-valued elements, exact in every dtype used here.
Tensor Iota(const Shape& shape, DType dtype) {
  std::vector<int64_t> v(NumElements(shape));
  std::iota(v.begin(), v.end(), 1);
  return *Tensor::FromInts(v, shape, dtype);
}

TEST(PermuteTest, SwapsBatchAndSequence) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    const int64_t b = 3, s = 5, h = 7;
    Tensor x = Iota({b, s, h}, dtype);
    Tensor y = Tensor::Zeros({s, b, h}, dtype);
    auto out = ExpectSameOnTestDevice({x, y}, [](std::vector<Tensor>& t) {
      return Permute(t[0], {1, 0, 2}, &t[1]);
    });
    const std::vector<double> xv = x.ToDoubles(), got = out[1].ToDoubles();
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t si = 0; si < s; ++si)
        for (int64_t e = 0; e < h; ++e)
          ASSERT_EQ(got[(si * b + bi) * h + e], xv[(bi * s + si) * h + e]);
  }
}

TEST(PermuteTest, FourDimensionsAgainstIndexArithmetic) {
  const Shape xs = {2, 3, 4, 5};
  const std::vector<int> perm = {2, 0, 3, 1};
  Tensor x = Iota(xs, DType::kFloat32);
  Tensor y = Tensor::Zeros({4, 2, 5, 3}, DType::kFloat32);
  auto out = ExpectSameOnTestDevice({x, y}, [&](std::vector<Tensor>& t) {
    return Permute(t[0], perm, &t[1]);
  });
  const std::vector<double> xv = x.ToDoubles(), got = out[1].ToDoubles();
  int64_t j = 0;
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t c = 0; c < 5; ++c)
        for (int64_t d = 0; d < 3; ++d) {
          // y[a, b, c, d] = x[b, d, a, c].
          ASSERT_EQ(got[j++], xv[((b * 3 + d) * 4 + a) * 5 + c]);
        }
  Tensor bad = Tensor::Zeros({4, 2, 3, 5}, DType::kFloat32);
  EXPECT_FALSE(Permute(x, perm, &bad).ok());
  EXPECT_FALSE(Permute(x, {0, 0, 1, 2}, &y).ok());
}

TEST(ConcatSplitTest, RoundTripAlongEachDimension) {
  for (int dim = 0; dim < 3; ++dim) {
    Shape a = {2, 3, 4}, b = a, whole = a;
    b[dim] = 5;
    whole[dim] = a[dim] + 5;
    Tensor x0 = RandomTensor(a, DType::kBFloat16, 1);
    Tensor x1 = RandomTensor(b, DType::kBFloat16, 2);
    Tensor y = Tensor::Zeros(whole, DType::kBFloat16);
    auto cat = ExpectSameOnTestDevice({x0, x1, y}, [&](std::vector<Tensor>& t) {
      return Concat({t[0], t[1]}, dim, &t[2]);
    });
    // Reference: element at index i of y comes from x0 or x1.
    const std::vector<double> v0 = x0.ToDoubles(), v1 = x1.ToDoubles();
    const std::vector<double> got = cat[2].ToDoubles();
    int64_t j = 0;
    for (int64_t i0 = 0; i0 < whole[0]; ++i0)
      for (int64_t i1 = 0; i1 < whole[1]; ++i1)
        for (int64_t i2 = 0; i2 < whole[2]; ++i2) {
          int64_t idx[3] = {i0, i1, i2};
          const bool first = idx[dim] < a[dim];
          if (!first) idx[dim] -= a[dim];
          const Shape& sh = first ? a : b;
          const double want =
              (first ? v0 : v1)[(idx[0] * sh[1] + idx[1]) * sh[2] + idx[2]];
          ASSERT_EQ(got[j++], want) << "dim " << dim;
        }
    Tensor p0 = Tensor::Zeros(a, DType::kBFloat16);
    Tensor p1 = Tensor::Zeros(b, DType::kBFloat16);
    auto split =
        ExpectSameOnTestDevice({cat[2], p0, p1}, [&](std::vector<Tensor>& t) {
          return Split(t[0], dim, {&t[1], &t[2]});
        });
    EXPECT_EQ(split[1].ToDoubles(), v0);
    EXPECT_EQ(split[2].ToDoubles(), v1);
  }
}

TEST(ConcatSplitTest, RefusesPiecesThatDoNotFit) {
  Tensor x0 = Tensor::Zeros({2, 3}, DType::kFloat32);
  Tensor x1 = Tensor::Zeros({2, 4}, DType::kFloat32);
  Tensor y = Tensor::Zeros({2, 6}, DType::kFloat32);
  EXPECT_FALSE(Concat({x0, x1}, 1, &y).ok());
  EXPECT_FALSE(Concat({x0, x1}, 0, &y).ok());
  EXPECT_FALSE(Concat({x0, x1}, 2, &y).ok());
}

// The model's QKV split: qkv [s, b, groups, hpg + 2, d] (sequence-major
// rows) into q [b, s, groups, hpg, d] and k, v [b, s, groups, 1, d], as
// three strided copies, checked against the loop the model runs today.
TEST(CopyStridedTest, SplitsQkvAsTheModelDoes) {
  const int64_t s = 3, b = 2, groups = 2, hpg = 3, d = 4;
  const int64_t g_row = groups * (hpg + 2) * d;
  Tensor qkv = Iota({s * b, g_row}, DType::kFloat32);
  Tensor q = Tensor::Zeros({b, s, groups, hpg, d}, DType::kFloat32);
  Tensor k = Tensor::Zeros({b, s, groups, 1, d}, DType::kFloat32);
  Tensor v = Tensor::Zeros({b, s, groups, 1, d}, DType::kFloat32);
  auto plan = [&](const Tensor& out, int64_t offset) {
    StridedCopyPlan p;
    p.rank = 5;
    const int64_t shape[5] = {b, s, groups, out.size(3), d};
    const int64_t src[5] = {g_row, b * g_row, (hpg + 2) * d, d, 1};
    std::copy(shape, shape + 5, p.shape);
    std::copy(src, src + 5, p.src_strides);
    ContiguousStrides(out.shape(), p.dst_strides);
    p.src_offset = offset;
    return p;
  };
  auto out =
      ExpectSameOnTestDevice({qkv, q, k, v}, [&](std::vector<Tensor>& t) {
        MCC_RETURN_IF_ERROR(CopyStrided(t[0], plan(t[1], 0), &t[1]));
        MCC_RETURN_IF_ERROR(CopyStrided(t[0], plan(t[2], hpg * d), &t[2]));
        return CopyStrided(t[0], plan(t[3], (hpg + 1) * d), &t[3]);
      });
  // The model's loop (models/gpt/transformer_layer.cc, SplitQkv).
  const std::vector<float> src = qkv.ToFloats();
  std::vector<float> wq(q.numel()), wk(k.numel()), wv(v.numel());
  for (int64_t t = 0; t < s * b; ++t) {
    const int64_t si = t / b, bi = t % b, tok = bi * s + si;
    for (int64_t g = 0; g < groups; ++g) {
      const float* grp = src.data() + t * g_row + g * (hpg + 2) * d;
      for (int64_t j = 0; j < hpg; ++j)
        std::copy_n(grp + j * d, d,
                    wq.data() + ((tok * groups + g) * hpg + j) * d);
      std::copy_n(grp + hpg * d, d, wk.data() + (tok * groups + g) * d);
      std::copy_n(grp + (hpg + 1) * d, d, wv.data() + (tok * groups + g) * d);
    }
  }
  EXPECT_EQ(out[1].ToFloats(), wq);
  EXPECT_EQ(out[2].ToFloats(), wk);
  EXPECT_EQ(out[3].ToFloats(), wv);
  // The backward's merge: the swapped plans put every element back.
  Tensor merged = Tensor::Zeros(qkv.shape(), DType::kFloat32);
  auto back = ExpectSameOnTestDevice(
      {out[1], out[2], out[3], merged}, [&](std::vector<Tensor>& t) {
        MCC_RETURN_IF_ERROR(CopyStrided(t[0], SwapSides(plan(t[0], 0)), &t[3]));
        MCC_RETURN_IF_ERROR(
            CopyStrided(t[1], SwapSides(plan(t[1], hpg * d)), &t[3]));
        return CopyStrided(t[2], SwapSides(plan(t[2], (hpg + 1) * d)), &t[3]);
      });
  EXPECT_EQ(back[3].ToFloats(), src);
}

TEST(CopyStridedTest, CopiesAPieceOfAFlatBuffer) {
  Tensor flat = Iota({100}, DType::kFloat32);
  Tensor piece = Tensor::Zeros({30}, DType::kFloat32);
  StridedCopyPlan p;
  p.rank = 1;
  p.shape[0] = 30;
  p.src_strides[0] = 1;
  p.dst_strides[0] = 1;
  p.src_offset = 55;
  auto out = ExpectSameOnTestDevice({flat, piece}, [&](std::vector<Tensor>& t) {
    return CopyStrided(t[0], p, &t[1]);
  });
  const std::vector<float> got = out[1].ToFloats();
  for (int i = 0; i < 30; ++i) EXPECT_EQ(got[i], 56 + i);
}

// The plan's copy by its definition (every index by division).
std::vector<double> CopyByDefinition(const std::vector<double>& src,
                                     const StridedCopyPlan& p,
                                     std::vector<double> dst) {
  int64_t total = 1;
  for (int k = 0; k < p.rank; ++k) total *= p.shape[k];
  for (int64_t flat = 0; flat < total; ++flat) {
    int64_t rest = flat, so = p.src_offset, dof = p.dst_offset;
    for (int k = p.rank - 1; k >= 0; --k) {
      const int64_t i = rest % p.shape[k];
      rest /= p.shape[k];
      so += i * p.src_strides[k];
      dof += i * p.dst_strides[k];
    }
    dst[dof] = src[so];
  }
  return dst;
}

// Many runs split over several threads (chunks start mid-way through the
// outer dimensions), contiguous runs of 2 to 600 bytes, and runs strided on
// either side, against the definition.
TEST(CopyStridedTest, ChunkedCopiesMatchTheDefinition) {
  const int threads = ThreadPool::Global().num_threads();
  ThreadPool::SetGlobalThreads(3);
  for (DType dtype : {DType::kBFloat16, DType::kFloat32, DType::kInt64}) {
    for (int64_t d : {1, 15, 16, 17, 64, 75, 128, 129, 150}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(dtype) << " d=" << d);
      // At least 3 chunks of kGrain / d runs each.
      const int64_t b = 3, groups = 5, sq = 3 * 32768 / (b * groups * d) + 1;
      const int64_t row = groups * 3 * d;
      // Random values: distinct enough in bf16 that a misplaced run shows.
      Tensor src = dtype == DType::kInt64
                       ? Iota({sq * b, row}, dtype)
                       : RandomTensor({sq * b, row}, dtype, 7);
      for (bool transposed : {false, true}) {
        // Split-like: rows [s, b] of [groups, 3, d] -> [b, s, groups, d]
        // (part 1); transposed: -> [b, s, d, groups] (runs strided in dst).
        StridedCopyPlan p;
        p.rank = 4;
        const int64_t shape[4] = {b, sq, groups, d};
        const int64_t ss[4] = {row, b * row, 3 * d, 1};
        const int64_t ds[4] = {sq * groups * d, groups * d, transposed ? 1 : d,
                               transposed ? groups : 1};
        for (int k = 0; k < 4; ++k) {
          p.shape[k] = shape[k];
          p.src_strides[k] = ss[k];
          p.dst_strides[k] = ds[k];
        }
        p.src_offset = d;
        Tensor dst = Tensor::Zeros({b * sq * groups * d}, dtype);
        ASSERT_TRUE(CopyStrided(src, p, &dst).ok());
        const std::vector<double> zeros(dst.numel(), 0.0);
        EXPECT_EQ(dst.ToDoubles(), CopyByDefinition(src.ToDoubles(), p, zeros))
            << (transposed ? "transposed" : "split");
      }
    }
  }
  ThreadPool::SetGlobalThreads(threads);
}

TEST(CopyStridedTest, RefusesBadPlans) {
  Tensor x = Tensor::Zeros({10}, DType::kFloat32);
  Tensor y = Tensor::Zeros({10}, DType::kFloat32);
  StridedCopyPlan p;
  p.rank = 1;
  p.shape[0] = 6;
  p.src_strides[0] = 2;  // Reaches element 10.
  p.dst_strides[0] = 1;
  EXPECT_EQ(CopyStrided(x, p, &y).code(), absl::StatusCode::kOutOfRange);
  p.src_strides[0] = 1;
  p.dst_strides[0] = 0;  // Every element into y[0].
  EXPECT_FALSE(CopyStrided(x, p, &y).ok());
  p.dst_strides[0] = 1;
  p.dst_offset = 3;  // x[0..6) into x[3..9): overlapping.
  EXPECT_FALSE(CopyStrided(x, p, &x).ok());
  Tensor z = Tensor::Zeros({10}, DType::kBFloat16);
  p.dst_offset = 0;
  EXPECT_FALSE(CopyStrided(x, p, &z).ok());  // dtypes differ.
  EXPECT_TRUE(CopyStrided(x, p, &y).ok());
}

}  // namespace
}  // namespace ops
}  // namespace mcc
