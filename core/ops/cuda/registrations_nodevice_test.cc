// Without a GPU: linking //core/ops/cuda:registrations puts a CUDA kernel in
// each slot it lists, and an op called on a CUDA tensor on a machine without
// the device returns FailedPrecondition naming the op (no crash, no
// Unimplemented). Skips where a CUDA device is present.
#include <array>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "core/cuda/runtime.h"
#include "core/ops/activation.h"
#include "core/ops/adamw.h"
#include "core/ops/bias.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/cuda/dropout.h"
#include "core/ops/cuda/registrations.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/gemm.h"
#include "core/ops/index_check.h"
#include "core/ops/int8_gemm.h"
#include "core/ops/int8_quantize.h"
#include "core/ops/layout.h"
#include "core/ops/loss_sum.h"
#include "core/ops/loss_totals.h"
#include "core/ops/multi_tensor.h"
#include "core/ops/norm.h"
#include "core/ops/reduce.h"
#include "core/ops/rotary.h"
#include "core/ops/sgd.h"
#include "core/tensor_kernels.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

const Device kCuda = Device::CUDA(0);

template <typename Slot>
void ExpectCudaKernel(const Slot& slot) {
  EXPECT_TRUE(slot.Get(kCuda).ok())
      << slot.op() << ": " << slot.Get(kCuda).status();
}

// Linking the library is enough: the slots hold CUDA kernels before any
// call, with or without a device.
TEST(CudaRegistrationsTest, SlotsHoldCudaKernels) {
  ExpectCudaKernel(GeluKernels());
  ExpectCudaKernel(GeluBackwardKernels());
  ExpectCudaKernel(BiasGeluKernels());
  ExpectCudaKernel(BiasGeluBackwardKernels());
  ExpectCudaKernel(SwiGLUKernels());
  ExpectCudaKernel(SwiGLUBackwardKernels());
  ExpectCudaKernel(BiasAddKernels());
  ExpectCudaKernel(BiasAddBackwardKernels());
  ExpectCudaKernel(AdamWKernels());
  ExpectCudaKernel(SgdKernels());
  ExpectCudaKernel(EmbeddingLookupKernels());
  ExpectCudaKernel(EmbeddingBackwardKernels());
  ExpectCudaKernel(FillKernels());
  ExpectCudaKernel(ConvertKernels());
  ExpectCudaKernel(ScaleKernels());
  ExpectCudaKernel(AddKernels());
  ExpectCudaKernel(AccumulateKernels());
  ExpectCudaKernel(LayerNormForwardKernels());
  ExpectCudaKernel(LayerNormBackwardKernels());
  ExpectCudaKernel(RMSNormForwardKernels());
  ExpectCudaKernel(RMSNormBackwardKernels());
  ExpectCudaKernel(CrossEntropyForwardKernels());
  ExpectCudaKernel(CrossEntropyBackwardKernels());
  ExpectCudaKernel(CrossEntropyMeanLossKernels());
  ExpectCudaKernel(ShardedCrossEntropyRowMaxKernels());
  ExpectCudaKernel(ShardedCrossEntropySumsKernels());
  ExpectCudaKernel(ShardedCrossEntropyLossKernels());
  ExpectCudaKernel(ShardedCrossEntropyBackwardKernels());
  ExpectCudaKernel(GemmKernels());
  ExpectCudaKernel(BatchedGemmKernels());
  ExpectCudaKernel(StridedCopyKernels());
  ExpectCudaKernel(RotaryForwardKernels());
  ExpectCudaKernel(DropoutKernels());
  ExpectCudaKernel(RotaryBackwardKernels());
  ExpectCudaKernel(LossSumKernels());
  ExpectCudaKernel(LossSumGradientKernels());
  ExpectCudaKernel(ReduceKernels());
  ExpectCudaKernel(MultiTensorSumOfSquaresKernels());
  EXPECT_TRUE(cuda::RegisterCudaKernels());  // Again: harmless.
}

// The dropout kernel's Philox generator, run on the host, gives the CPU
// generator's words, so the masks agree (the GPU test compares the masks).
TEST(CudaRegistrationsTest, DropoutGeneratorMatchesCpu) {
  for (uint64_t seed :
       {uint64_t{0}, uint64_t{42}, uint64_t{0x1234567890abcdef}}) {
    for (uint64_t j : {uint64_t{0}, uint64_t{1}, uint64_t{12345},
                       (uint64_t{1} << 32) + 3, ~uint64_t{0} >> 2}) {
      uint32_t got[4];
      cuda_kernels::PhiloxBlockForTesting(j, seed, got);
      const std::array<uint32_t, 4> want = Philox4x32_10(
          {static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32), 0, 0},
          {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
      for (int r = 0; r < 4; ++r) {
        EXPECT_EQ(got[r], want[r]) << "seed " << seed << " block " << j;
      }
    }
  }
}

class NoCudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::mcc::cuda::CudaDeviceCount() > 0) {
      GTEST_SKIP() << "a CUDA device is present: the no-device errors are "
                      "checked on machines without one";
    }
  }

  // A CUDA tensor over an address no kernel may touch: without a device
  // nothing can be allocated there, and nothing must be launched.
  static Tensor Fake(Shape shape, DType dtype) {
    return Tensor::FromExternal(reinterpret_cast<void*>(0x1000),
                                std::move(shape), dtype, kCuda, nullptr);
  }

  static void ExpectNoDevice(const absl::Status& status, const char* op) {
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_TRUE(absl::StartsWith(status.message(),
                                 absl::StrCat(op, ": no CUDA device: cuda:0")))
        << status;
  }
};

TEST_F(NoCudaDeviceTest, OpsOnCudaTensorsGiveClearErrors) {
  Tensor x = Fake({4, 8}, DType::kFloat32);
  Tensor y = Fake({4, 8}, DType::kFloat32);
  Tensor h = Fake({8}, DType::kFloat32);
  Tensor h2 = Fake({8}, DType::kFloat32);
  Tensor rows = Fake({4}, DType::kFloat32);
  Tensor rows2 = Fake({4}, DType::kFloat32);
  Tensor targets = Fake({4}, DType::kInt64);
  ExpectNoDevice(Gelu(x, &y), "Gelu");
  ExpectNoDevice(GeluBackward(x, x, &y), "GeluBackward");
  ExpectNoDevice(BiasAdd(x, h, &y), "BiasAdd");
  ExpectNoDevice(BiasGelu(x, h, &y), "BiasGelu");
  ExpectNoDevice(BiasGeluBackward(x, x, h, &y, &h2), "BiasGeluBackward");
  Tensor half = Fake({4, 4}, DType::kFloat32);
  ExpectNoDevice(SwiGLU(x, &half), "SwiGLU");
  ExpectNoDevice(SwiGLUBackward(half, x, &y), "SwiGLUBackward");
  ExpectNoDevice(BiasAddBackward(x, &h), "BiasAddBackward");
  Tensor m = Fake({4, 8}, DType::kFloat32), v = Fake({4, 8}, DType::kFloat32);
  ExpectNoDevice(AdamWStep(AdamWConfig(), x, &y, &m, &v), "AdamWStep");
  ExpectNoDevice(Fill(1.0, &x), "Fill");
  ExpectNoDevice(Dropout(x, 0.1f, 7, 0, &y), "Dropout");
  ExpectNoDevice(SgdStep(SgdConfig(), x, &y, nullptr), "SgdStep");
  Tensor table = Fake({16, 8}, DType::kFloat32);
  ExpectNoDevice(EmbeddingLookup(targets, table, &y), "EmbeddingLookup");
  ExpectNoDevice(EmbeddingBackward(targets, y, &table), "EmbeddingBackward");
  Tensor xb = Fake({4, 8}, DType::kBFloat16);
  ExpectNoDevice(Convert(x, &xb), "Convert");
  ExpectNoDevice(Scale(x, 2.0f, &y), "Scale");
  ExpectNoDevice(Add(x, x, &y), "Add");
  ExpectNoDevice(Accumulate(x, 1.0f, &y), "Accumulate");
  ExpectNoDevice(LayerNormForward(x, h, h2, 1e-5f, &y, &rows, &rows2),
                 "LayerNormForward");
  ExpectNoDevice(LayerNormBackward(x, x, h, rows, rows2, &y, &h2, nullptr),
                 "LayerNormBackward");
  ExpectNoDevice(RMSNormForward(x, h, 1e-5f, &y, &rows2), "RMSNormForward");
  ExpectNoDevice(RMSNormBackward(x, x, h, rows2, &y, &h2), "RMSNormBackward");
  ExpectNoDevice(CrossEntropyForward(x, targets, &rows, &rows2),
                 "CrossEntropyForward");
  ExpectNoDevice(CrossEntropyBackward(x, targets, rows, rows2, &y),
                 "CrossEntropyBackward");
  ExpectNoDevice(CrossEntropyMeanLoss(rows, targets).status(),
                 "CrossEntropyMeanLoss");
  ExpectNoDevice(ShardedCrossEntropyRowMax(x, 8, &rows),
                 "ShardedCrossEntropyRowMax");
  Tensor sums = Fake({2, 4}, DType::kFloat32);
  ExpectNoDevice(ShardedCrossEntropySums(x, targets, rows, 0, 8, &sums),
                 "ShardedCrossEntropySums");
  ExpectNoDevice(ShardedCrossEntropyLoss(sums, targets, -100, &rows2),
                 "ShardedCrossEntropyLoss");
  ExpectNoDevice(ShardedCrossEntropyBackward(x, targets, rows, sums, rows2, 0,
                                             8, -100, &y),
                 "ShardedCrossEntropyBackward");
  Tensor a = Fake({4, 3}, DType::kFloat32), b = Fake({3, 8}, DType::kFloat32);
  ExpectNoDevice(Gemm(a, false, b, false, &y), "Gemm");
  Tensor a3 = Fake({2, 4, 3}, DType::kFloat32);
  Tensor c3 = Fake({2, 4, 8}, DType::kFloat32);
  ExpectNoDevice(BatchedGemm(a3, false, b, false, &c3), "BatchedGemm");
  Tensor yt = Fake({8, 4}, DType::kFloat32);
  ExpectNoDevice(Permute(x, {1, 0}, &yt), "StridedCopy");
  Tensor q = Fake({1, 2, 2, 8}, DType::kFloat32);
  Tensor q2 = Fake({1, 2, 2, 8}, DType::kFloat32);
  ExpectNoDevice(RotaryForward(q, RotaryOptions(), &q2), "RotaryForward");
  ExpectNoDevice(RotaryBackward(q, RotaryOptions(), &q2), "RotaryBackward");
  Tensor sum4 = Fake({4}, DType::kFloat32);
  ExpectNoDevice(LossSum(rows, Tensor(), targets, -100, false, &sum4),
                 "LossSum");
  ExpectNoDevice(LossSumGradient(sum4, Tensor(), 1.0f, &rows2),
                 "LossSumGradient");
  ExpectNoDevice(CheckIndexRange(targets, 16, -100, "token id"),
                 "CheckIndexRange");
  Tensor totals = Fake({kLossTotalsSize}, DType::kFloat32);
  Tensor packed = Fake({kPackedLossTotalsSize}, DType::kFloat32);
  ExpectNoDevice(AccumulateLossTotals(sum4, 2, &totals),
                 "AccumulateLossTotals");
  ExpectNoDevice(PackLossTotals(totals, &packed), "PackLossTotals");
  ExpectNoDevice(RowAbsMax(x, &rows), "RowAbsMax");
  Tensor q8 = Fake({4, 8}, DType::kInt8);
  ExpectNoDevice(QuantizeRowsInt8(x, rows, &q8, &rows2), "QuantizeRowsInt8");
  Tensor scales = Fake({8}, DType::kFloat32);
  Tensor q88 = Fake({8, 8}, DType::kInt8);
  ExpectNoDevice(Int8Gemm(x, q88, scales, &y), "Int8Gemm");
  ExpectNoDevice(Sum(x).status(), "Sum");
  ExpectNoDevice(
      MultiTensorSumOfSquares({x, y}, {}, SumOfSquaresOptions(), &sum4),
      "MultiTensorSumOfSquares");
}

}  // namespace
}  // namespace ops
}  // namespace mcc
