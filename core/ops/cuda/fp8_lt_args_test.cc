// The cuBLASLt FP8 matmul's arguments (fp8_lt_gemm.h: TN layout, which
// operand is copied transposed, sizes, leading dimensions, FP8 types),
// checked without a GPU: the FP8 copies written on the host as the cast
// kernel writes them (core/fp8.h's codes), multiplied by a column-major
// GEMM written here from cuBLASLt's definition (D = alpha scale_A scale_B
// op(A) op(B) + beta C, A op T, B op N), against the CPU Fp8Gemm kernel.
// Every transpose combination, mixed formats, beta, and the refused cases.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/fp8.h"
#include "core/ops/cuda/fp8_lt_gemm.h"
#include "core/ops/fp8_gemm.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using internal::Fp8LtArgs;
using internal::Fp8LtGemmArgs;

Tensor Random(const Shape& shape, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(NumElements(shape));
  for (float& x : v) x = dist(gen);
  return *Tensor::FromVector(v, shape);
}

// The cast kernel's output (fp8.h's CastToFp8Bytes): x [rows, cols] scaled
// and encoded, as [rows, cols] or, transposed, [cols, rows].
std::vector<uint8_t> HostCast(const Tensor& x, float scale, Fp8Format f,
                              bool transpose) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const float* p = x.data<float>();
  std::vector<uint8_t> out(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out[transpose ? c * rows + r : r * cols + c] =
          FloatToFp8(p[r * cols + c] * scale, f);
    }
  }
  return out;
}

Fp8Format FormatOf(cudaDataType_t t) {
  return t == CUDA_R_8F_E4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
}

// cuBLASLt's D = alpha sa_ptr sb_ptr op_T(first) op_N(second) + beta C in
// column-major terms: first stored k x m (ld_first), second k x n
// (ld_second), C m x n (ldc), in place.
void ColumnMajorFp8(const Fp8LtArgs& g, const std::vector<uint8_t>& first,
                    const std::vector<uint8_t>& second, double scale_first,
                    double scale_second, float alpha, float beta, float* c) {
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double sum = 0;
      for (int64_t l = 0; l < g.k; ++l) {
        sum += double{Fp8ToFloat(first[l + i * g.ld_first],
                                 FormatOf(g.first_type))} *
               Fp8ToFloat(second[l + j * g.ld_second], FormatOf(g.second_type));
      }
      float& d = c[i + j * g.ldc];
      d = static_cast<float>(alpha * scale_first * scale_second * sum +
                             beta * double{d});
    }
  }
}

TEST(Fp8LtArgsTest, TnLayoutGivesTheCpuKernelsProduct) {
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {{16, 16, 16}, {32, 48, 64}, {7, 32, 80}};
  const std::pair<Fp8Format, Fp8Format> formats[] = {
      {Fp8Format::kE4M3, Fp8Format::kE4M3},
      {Fp8Format::kE4M3, Fp8Format::kE5M2},
      {Fp8Format::kE5M2, Fp8Format::kE4M3}};
  const float sa = 3.0f, sb = 7.5f, alpha = 0.5f;
  for (const Case& cs : cases) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (const auto& [fa, fb] : formats) {
          for (float beta : {0.0f, 1.0f}) {
            SCOPED_TRACE(absl::StrCat(cs.m, "x", cs.n, "x", cs.k, " ta ", ta,
                                      " tb ", tb, " ", Fp8FormatName(fa), "/",
                                      Fp8FormatName(fb), " beta ", beta));
            const Shape as = ta ? Shape{cs.k, cs.m} : Shape{cs.m, cs.k};
            const Shape bs = tb ? Shape{cs.n, cs.k} : Shape{cs.k, cs.n};
            const Tensor a = Random(as, 1), b = Random(bs, 2);
            const Tensor c0 = Random({cs.m, cs.n}, 3);
            auto args = Fp8LtGemmArgs(as, ta, fa, bs, tb, fb, DType::kFloat32);
            ASSERT_TRUE(args.ok()) << args.status();
            EXPECT_EQ(args->c_type, CUDA_R_32F);
            const std::vector<uint8_t> first =
                HostCast(b, sb, fb, args->transpose_b);
            const std::vector<uint8_t> second =
                HostCast(a, sa, fa, args->transpose_a);
            ASSERT_EQ(static_cast<int64_t>(first.size()), args->m * args->k);
            ASSERT_EQ(static_cast<int64_t>(second.size()), args->n * args->k);
            Tensor got = c0.Clone();
            ColumnMajorFp8(*args, first, second, 1.0 / sb, 1.0 / sa, alpha,
                           beta, got.data<float>());
            Tensor want = c0.Clone();
            ASSERT_TRUE(Fp8Gemm(a, ta, fa, *Tensor::FromVector({sa}, {1}), b,
                                tb, fb, *Tensor::FromVector({sb}, {1}), &want,
                                alpha, beta)
                            .ok());
            const std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
            for (size_t i = 0; i < g.size(); ++i) {
              ASSERT_NEAR(g[i], w[i], 1e-5 * (1 + std::fabs(w[i])))
                  << "element " << i;
            }
          }
        }
      }
    }
  }
}

TEST(Fp8LtArgsTest, TheForwardNeedsNoTransposedCopy) {
  // y [M, N] = x [M, K] W^T, W [N, K]: both operands as stored.
  auto args = Fp8LtGemmArgs({8, 64}, false, Fp8Format::kE4M3, {32, 64}, true,
                            Fp8Format::kE4M3, DType::kBFloat16);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->transpose_a);
  EXPECT_FALSE(args->transpose_b);
  EXPECT_EQ(args->m, 32);
  EXPECT_EQ(args->n, 8);
  EXPECT_EQ(args->k, 64);
  EXPECT_EQ(args->c_type, CUDA_R_16BF);
}

TEST(Fp8LtArgsTest, RefusedCasesFallBack) {
  const auto refused = [](const Shape& a, bool ta, Fp8Format fa, const Shape& b,
                          bool tb, Fp8Format fb) {
    return Fp8LtGemmArgs(a, ta, fa, b, tb, fb, DType::kFloat32).status().code();
  };
  const Fp8Format e4 = Fp8Format::kE4M3, e5 = Fp8Format::kE5M2;
  EXPECT_EQ(refused({16, 32}, false, e5, {32, 16}, false, e5),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(refused({16, 24}, false, e4, {24, 16}, false, e4),
            absl::StatusCode::kUnimplemented);  // K 24
  EXPECT_EQ(refused({16, 32}, false, e4, {32, 40}, false, e4),
            absl::StatusCode::kUnimplemented);  // N 40
  EXPECT_EQ(refused({3, 32}, false, e4, {32, 16}, false, e4),
            absl::StatusCode::kOk);  // M is free.
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
