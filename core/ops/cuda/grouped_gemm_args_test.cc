// The grouped route's cublasGemmGroupedBatchedEx arguments (transposes,
// sizes, leading dimensions, operand addresses; grouped_gemm.h), built over
// CPU tensors and run through a column-major GEMM reference written here
// from cuBLAS's definition, against the CPU GroupedGemm kernel: the mapping
// from row-major groups to cuBLAS's terms is checked without a GPU. Empty
// groups, both weight layouts, beta, fp32 and bf16.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/half.h"
#include "core/ops/cuda/grouped_gemm.h"
#include "core/ops/grouped_gemm.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

Tensor Random(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(NumElements(shape));
  for (float& x : v) x = dist(gen);
  return *Tensor::FromVector(v, shape, dtype);
}

double Load(const void* p, DType t, int64_t i) {
  return t == DType::kBFloat16
             ? BFloat16ToFloat(static_cast<const BFloat16*>(p)[i])
             : static_cast<const float*>(p)[i];
}

void Store(const void* p, DType t, int64_t i, double v) {
  if (t == DType::kBFloat16) {
    static_cast<BFloat16*>(const_cast<void*>(p))[i] =
        FloatToBFloat16(static_cast<float>(v));
  } else {
    static_cast<float*>(const_cast<void*>(p))[i] = static_cast<float>(v);
  }
}

// cuBLAS's C = alpha op(A) op(B) + beta C, column-major, alpha = 1, for
// every problem of args (operands of `in`, C of `out`).
void RunColumnMajor(const internal::CublasGroupedArgs& a, DType in, DType out,
                    float beta) {
  const int count = a.count();
  for (int p = 0; p < count; ++p) {
    const void* first = a.pointers[p];
    const void* second = a.pointers[count + p];
    const void* c = a.pointers[2 * count + p];
    const bool ta = a.op_first[p] == CUBLAS_OP_T;
    const bool tb = a.op_second[p] == CUBLAS_OP_T;
    for (int i = 0; i < a.m[p]; ++i) {
      for (int j = 0; j < a.n[p]; ++j) {
        double sum = 0.0;
        for (int l = 0; l < a.k[p]; ++l) {
          const double x = Load(first, in,
                                ta ? l + int64_t{i} * a.ld_first[p]
                                   : i + int64_t{l} * a.ld_first[p]);
          const double y = Load(second, in,
                                tb ? j + int64_t{l} * a.ld_second[p]
                                   : l + int64_t{j} * a.ld_second[p]);
          sum += x * y;
        }
        const int64_t at = i + int64_t{j} * a.ldc[p];
        Store(c, out, at, sum + beta * Load(c, out, at));
      }
    }
  }
}

void ExpectNear(const Tensor& got, const Tensor& want, double tolerance) {
  const std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_NEAR(g[i], w[i], tolerance * (1.0 + std::fabs(w[i])))
        << "element " << i;
  }
}

const std::vector<int64_t> kSizes = {3, 0, 7, 1, 0, 5};

TEST(GroupedGemmArgsTest, ForwardMapsOntoColumnMajorGemms) {
  const int64_t groups = static_cast<int64_t>(kSizes.size()), m = 16, k = 6,
                n = 5;
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    for (bool trans_w : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << DTypeName(dt) << " trans_w " << trans_w);
      const Tensor x = Random({m, k}, dt, 1);
      const Tensor w =
          Random(trans_w ? Shape{groups, n, k} : Shape{groups, k, n}, dt, 2);
      const Tensor y0 = Random({m, n}, dt, 3);
      Tensor want = y0.Clone();
      ASSERT_TRUE(GroupedGemm(x, w, trans_w, kSizes, &want, 0.5f).ok());
      Tensor got = y0.Clone();
      absl::StatusOr<internal::CublasGroupedArgs> args =
          internal::GroupedGemmArgs(x, w, trans_w, kSizes, got);
      ASSERT_TRUE(args.ok()) << args.status();
      EXPECT_EQ(args->count(), 4);  // The non-empty groups.
      RunColumnMajor(*args, dt, dt, 0.5f);
      // Both round once from a float accumulation (bf16: one ulp apart at
      // most).
      ExpectNear(got, want, dt == DType::kFloat32 ? 1e-5 : 1.0 / 128);
    }
  }
}

TEST(GroupedGemmArgsTest, WeightGradMapsOntoColumnMajorGemms) {
  const int64_t groups = static_cast<int64_t>(kSizes.size()), m = 16, k = 6,
                n = 5;
  for (bool trans_w : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "trans_w " << trans_w);
    const Tensor x = Random({m, k}, DType::kFloat32, 4);
    const Tensor dy = Random({m, n}, DType::kFloat32, 5);
    const Tensor dw0 =
        Random(trans_w ? Shape{groups, n, k} : Shape{groups, k, n},
               DType::kFloat32, 6);
    Tensor want = dw0.Clone();
    ASSERT_TRUE(
        GroupedGemmWeightGrad(x, dy, trans_w, kSizes, &want, 1.0f).ok());
    Tensor got = dw0.Clone();
    absl::StatusOr<internal::CublasGroupedArgs> args =
        internal::GroupedWeightGradArgs(x, dy, trans_w, kSizes, got);
    ASSERT_TRUE(args.ok()) << args.status();
    EXPECT_EQ(args->count(), 4);
    RunColumnMajor(*args, DType::kFloat32, DType::kFloat32, 1.0f);
    ExpectNear(got, want, 1e-5);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
