// Validation of the CUDA ops that needs no GPU: CPU tensors and bad dtypes
// are refused with messages that name the op and the tensor.
#include "absl/strings/match.h"
#include "core/ops/cuda/gemm.h"
#include "core/ops/cuda/ops.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace cuda {
namespace {

void ExpectError(const absl::Status& status, absl::string_view op,
                 absl::string_view fragment) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), op)) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), fragment)) << status;
}

TEST(CudaOpsValidationTest, CpuTensorsAreRefused) {
  Tensor x = Tensor::Zeros({3, 5}, DType::kFloat32);
  const std::string cpu = "must be a CUDA tensor, got fp32[3, 5] on cpu";
  ExpectError(GeluForward(x).status(), "GeluForward", cpu);
  ExpectError(GeluBackward(x, x).status(), "GeluBackward", cpu);
  ExpectError(BiasAdd(x, x).status(), "BiasAdd", cpu);
  ExpectError(BiasGrad(x).status(), "BiasGrad", cpu);
  ExpectError(Convert(x, DType::kBFloat16).status(), "Convert", cpu);
  ExpectError(LayerNormForward(x, x, x, 1e-5f).status(), "LayerNormForward",
              cpu);
  ExpectError(LayerNormBackward(x, x, x, x, x).status(), "LayerNormBackward",
              cpu);
  ExpectError(SoftmaxCrossEntropyForward(x, x).status(),
              "SoftmaxCrossEntropyForward", "logits must be a CUDA tensor");
  ExpectError(SoftmaxCrossEntropyBackward(x, x, x, x).status(),
              "SoftmaxCrossEntropyBackward", "logits must be a CUDA tensor");
  ExpectError(AdamWStep(x, x, x, x, AdamWConfig(), 1), "AdamWStep", cpu);
  ExpectError(Matmul(x, x).status(), "Gemm",
              "operands must be CUDA tensors, got A fp32[3, 5] on cpu");
  ExpectError(GeluForward(Tensor()).status(), "GeluForward", "x is undefined");
}

}  // namespace
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
