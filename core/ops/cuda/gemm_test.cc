// cuBLAS GEMMs against a float64 CPU reference: every transpose combination,
// alpha/beta, odd sizes, fp32 (TF32 off and on), bf16 inputs with fp32 and
// bf16 outputs, and batched strided. Skips without a CUDA device.
#include "core/ops/cuda/gemm.h"

#include <vector>

#include "absl/strings/match.h"
#include "core/cuda/runtime.h"
#include "core/ops/cuda/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

using ::mcc::cuda::CudaDeviceCount;
using testing::AllClose;
using testing::RandomHost;
using testing::ToCuda;

// Row-major float64 reference of alpha * op(A) op(B) + beta * C, batched over
// the leading dimension when the tensors are 3-D.
std::vector<double> Reference(const Tensor& a, const Tensor& b, const Tensor& c,
                              const GemmOptions& o) {
  const bool batched = a.dim() == 3;
  const int64_t batch = batched ? a.size(0) : 1;
  const int64_t m = o.trans_a ? a.size(-1) : a.size(-2);
  const int64_t k = o.trans_a ? a.size(-2) : a.size(-1);
  const int64_t n = o.trans_b ? b.size(-2) : b.size(-1);
  const std::vector<double> A = a.ToDoubles(), B = b.ToDoubles(),
                            C = c.ToDoubles();
  std::vector<double> out(batch * m * n);
  for (int64_t p = 0; p < batch; ++p) {
    const double* ap = &A[p * m * k];
    const double* bp = &B[p * k * n];
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t l = 0; l < k; ++l) {
          const double av = o.trans_a ? ap[l * m + i] : ap[i * k + l];
          const double bv = o.trans_b ? bp[j * k + l] : bp[l * n + j];
          acc += av * bv;
        }
        const int64_t idx = p * m * n + i * n + j;
        out[idx] = o.alpha * acc + (o.beta != 0.0f ? o.beta * C[idx] : 0.0);
      }
    }
  }
  return out;
}

Shape OperandShape(int64_t batch, int64_t rows, int64_t cols, bool trans) {
  Shape s = trans ? Shape{cols, rows} : Shape{rows, cols};
  if (batch > 0) s.insert(s.begin(), batch);
  return s;
}

struct Case {
  DType in;
  DType out;
  bool allow_tf32;
  double atol, rtol;
};

void RunCase(const Case& cs, int64_t batch, int64_t m, int64_t n, int64_t k,
             uint32_t seed) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(cs.in), "->", DTypeName(cs.out),
                                cs.allow_tf32 ? " tf32" : "", " batch ", batch,
                                " m ", m, " n ", n, " k ", k, " ta ", ta,
                                " tb ", tb));
      GemmOptions o;
      o.trans_a = ta;
      o.trans_b = tb;
      o.alpha = 1.5f;
      o.beta = -0.5f;
      o.allow_tf32 = cs.allow_tf32;
      Tensor a = RandomHost(OperandShape(batch, m, k, ta), cs.in, seed);
      Tensor b = RandomHost(OperandShape(batch, k, n, tb), cs.in, seed + 1);
      Tensor c = RandomHost(batch > 0 ? Shape{batch, m, n} : Shape{m, n},
                            cs.out, seed + 2);
      Tensor c_dev = ToCuda(c);
      const absl::Status status = Gemm(ToCuda(a), ToCuda(b), c_dev, o);
      ASSERT_TRUE(status.ok()) << status;
      // Errors scale with sqrt(k) * |a||b|; inputs are in [-2, 2].
      const double scale = 4.0 * std::sqrt(static_cast<double>(k));
      EXPECT_TRUE(AllClose(c_dev.ToDoubles(), Reference(a, b, c, o),
                           cs.atol * scale, cs.rtol));
    }
  }
}

TEST(CudaGemmTest, Fp32MatchesReference) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: Fp32MatchesReference skipped";
  const Case fp32{DType::kFloat32, DType::kFloat32, false, 2e-6, 1e-5};
  RunCase(fp32, 0, 37, 53, 29, 1);
  RunCase(fp32, 0, 1, 129, 515, 2);
  RunCase(fp32, 0, 257, 191, 333, 3);
}

TEST(CudaGemmTest, Tf32WhenAllowed) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: Tf32WhenAllowed skipped";
  RunCase({DType::kFloat32, DType::kFloat32, true, 2e-3, 5e-3}, 0, 131, 77, 255,
          4);
}

TEST(CudaGemmTest, Bf16InputsAccumulateInFp32) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: Bf16InputsAccumulateInFp32 skipped";
  // fp32 output: only the accumulation's rounding, as the inputs are exact.
  RunCase({DType::kBFloat16, DType::kFloat32, false, 2e-6, 1e-5}, 0, 67, 45,
          301, 5);
  // bf16 output: one bf16 rounding of the result.
  RunCase({DType::kBFloat16, DType::kBFloat16, false, 2e-3, 8e-3}, 0, 67, 45,
          301, 6);
}

TEST(CudaGemmTest, BatchedStrided) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: BatchedStrided skipped";
  RunCase({DType::kFloat32, DType::kFloat32, false, 2e-6, 1e-5}, 3, 17, 23, 31,
          7);
  RunCase({DType::kBFloat16, DType::kFloat32, false, 2e-6, 1e-5}, 5, 33, 9, 65,
          8);
}

TEST(CudaGemmTest, MatmulAndShapeErrors) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: MatmulAndShapeErrors skipped";
  Tensor a = RandomHost({7, 5}, DType::kFloat32, 9);
  Tensor b = RandomHost({5, 3}, DType::kFloat32, 10);
  absl::StatusOr<Tensor> c = Matmul(ToCuda(a), ToCuda(b));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->shape(), Shape({7, 3}));
  Tensor zero = Tensor::Zeros({7, 3}, DType::kFloat32);
  EXPECT_TRUE(AllClose(c->ToDoubles(), Reference(a, b, zero, {}), 1e-5, 1e-5));
  // Inner dimensions that differ name both operands.
  absl::StatusOr<Tensor> bad = Matmul(ToCuda(a), ToCuda(a));
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "fp32[7, 5] on cuda:0"))
      << bad.status();
  // A C of the wrong shape is refused.
  Tensor wrong = Tensor::Zeros({3, 7}, DType::kFloat32, Device::CUDA(0));
  const absl::Status s = Gemm(ToCuda(a), ToCuda(b), wrong);
  EXPECT_TRUE(absl::StrContains(s.message(), "C must be fp32[7, 3]")) << s;
  // k == 0 gives zeros.
  Tensor a0 = Tensor::Zeros({4, 0}, DType::kFloat32, Device::CUDA(0));
  Tensor b0 = Tensor::Zeros({0, 6}, DType::kFloat32, Device::CUDA(0));
  absl::StatusOr<Tensor> c0 = Matmul(a0, b0);
  ASSERT_TRUE(c0.ok()) << c0.status();
  for (double v : c0->ToDoubles()) EXPECT_EQ(v, 0.0);
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
