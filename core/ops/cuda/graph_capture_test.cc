// CUDA graphs through the device-generic capture API (core/graph_capture.h,
// core/cuda/graph_capture.cc): captured kernels (elementwise, a cuBLASLt
// GEMM, a device copy) replay with the eager results bit for bit, new
// inputs copied into the static ones are seen, gradients accumulate across
// replays, the private pool keeps the graph's memory, and a host read inside
// the capture fails without breaking the stream. Skips without a device;
// the *_on_test_device build runs every line in CI.
#include "core/graph_capture.h"

#include <vector>

#include "absl/strings/match.h"
#include "core/ops/cuda/test_util.h"
#include "core/ops/elementwise.h"
#include "core/ops/gemm.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#ifndef MCC_KERNEL_TESTS_ON_TEST_DEVICE
#include <cuda_runtime.h>

#include "core/cuda/cuda_allocator.h"
#include "core/cuda/stream.h"
#endif

namespace mcc {
namespace ops {
namespace cuda {
namespace testing {
namespace {

class GraphCaptureTest : public CudaTest {};

// y = x @ w + 0.5 * x @ w, through a temporary made inside the capture.
absl::Status Body(const Tensor& x, const Tensor& w, Tensor* y) {
  Tensor xw =
      Tensor::Empty({x.shape()[0], w.shape()[1]}, DType::kFloat32, x.device());
  if (absl::Status s = Gemm(x, false, w, false, &xw); !s.ok()) return s;
  if (absl::Status s = Scale(xw, 1.0f, y); !s.ok()) return s;
  return Accumulate(xw, 0.5f, y);
}

TEST_F(GraphCaptureTest, ReplayMatchesEagerAndSeesCopiedInputs) {
  const Device dev = KernelDevice();
  Tensor x = ToCuda(RandomHost({33, 64}, DType::kFloat32, 1));
  Tensor w = ToCuda(RandomHost({64, 17}, DType::kFloat32, 2));
  Tensor y = Tensor::Zeros({33, 17}, DType::kFloat32, dev);
  // Warm-up outside the capture (cuBLASLt handle and plan caches).
  ASSERT_TRUE(Body(x, w, &y).ok());

  ASSERT_TRUE(BeginGraphCapture(dev).ok());
  absl::Status body = Body(x, w, &y);
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  ASSERT_TRUE(body.ok()) << body;
  ASSERT_TRUE(graph.ok()) << graph.status();

  for (uint32_t seed : {3u, 4u, 5u}) {
    const Tensor next = RandomHost({33, 64}, DType::kFloat32, seed);
    ASSERT_TRUE(x.CopyFrom(next).ok());
    ASSERT_TRUE(graph->Replay().ok());
    Tensor eager = Tensor::Zeros({33, 17}, DType::kFloat32, dev);
    ASSERT_TRUE(Body(ToCuda(next), w, &eager).ok());
    // The same kernels on the same inputs: bit-identical.
    EXPECT_EQ(Values(y), Values(eager)) << "seed " << seed;
  }
}

TEST_F(GraphCaptureTest, ReplaysAccumulateIntoMainGrad) {
  const Device dev = KernelDevice();
  const Tensor g_host = RandomHost({1000}, DType::kFloat32, 7);
  Tensor grad = ToCuda(g_host);
  Tensor main_grad = Tensor::Zeros({1000}, DType::kFloat32, dev);
  ASSERT_TRUE(BeginGraphCapture(dev).ok());
  ASSERT_TRUE(Accumulate(grad, 1.0f, &main_grad).ok());
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(graph->Replay().ok());
  const std::vector<double> got = Values(main_grad);
  const std::vector<double> g = g_host.ToDoubles();
  for (size_t i = 0; i < g.size(); ++i) {
    // ((g + g) + g) + g in fp32, exactly as four eager accumulations.
    float want = 0.0f;
    for (int k = 0; k < 4; ++k) want += static_cast<float>(g[i]);
    ASSERT_EQ(got[i], want) << i;
  }
}

TEST_F(GraphCaptureTest, DeviceCopyAndPoolMemoryOutliveTheCapture) {
  const Device dev = KernelDevice();
  const Tensor src_host = RandomHost({4096}, DType::kFloat32, 9);
  Tensor src = ToCuda(src_host);
  Tensor out = Tensor::Zeros({4096}, DType::kFloat32, dev);
#ifndef MCC_KERNEL_TESTS_ON_TEST_DEVICE
  ::mcc::cuda::CudaAllocator* alloc = ::mcc::cuda::GetCudaAllocator(0);
  const int64_t pool_before = alloc->PoolBytes();
#endif
  ASSERT_TRUE(BeginGraphCapture(dev).ok());
  {
    Tensor tmp = Tensor::Empty({4096}, DType::kFloat32, dev);
    ASSERT_TRUE(tmp.CopyFrom(src).ok());
    ASSERT_TRUE(Scale(tmp, 2.0f, &out).ok());
  }  // tmp freed inside the capture: its memory stays the graph's.
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
#ifndef MCC_KERNEL_TESTS_ON_TEST_DEVICE
  EXPECT_GT(alloc->PoolBytes(), pool_before);
#endif
  // Allocations after the capture must not land on the graph's memory.
  std::vector<Tensor> others;
  for (int i = 0; i < 8; ++i) {
    others.push_back(Tensor::Full({4096}, -1.0, DType::kFloat32, dev));
  }
  ASSERT_TRUE(graph->Replay().ok());
  std::vector<double> want = src_host.ToDoubles();
  for (double& v : want) v *= 2.0;
  EXPECT_EQ(Values(out), want);
  for (const Tensor& t : others) {
    for (double v : Values(t)) ASSERT_EQ(v, -1.0);
  }
  *graph = DeviceGraph();  // Destroys it and releases the pool.
#ifndef MCC_KERNEL_TESTS_ON_TEST_DEVICE
  EXPECT_EQ(alloc->PoolBytes(), pool_before);
#endif
}

TEST_F(GraphCaptureTest, HostReadInsideCaptureFailsCleanly) {
  const Device dev = KernelDevice();
  Tensor x = ToCuda(RandomHost({16}, DType::kFloat32, 11));
  ASSERT_TRUE(BeginGraphCapture(dev).ok());
  absl::StatusOr<Tensor> host = x.To(Device::CPU());
  EXPECT_EQ(host.status().code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  EXPECT_FALSE(graph.ok());
  EXPECT_TRUE(absl::StrContains(graph.status().message(), "graph capture"))
      << graph.status();
  // The device is usable afterwards (the refused copy never reached CUDA).
  Tensor y = Tensor::Zeros({16}, DType::kFloat32, dev);
  ASSERT_TRUE(Scale(x, 1.0f, &y).ok());
  EXPECT_EQ(Values(y), Values(x));
}

#ifndef MCC_KERNEL_TESTS_ON_TEST_DEVICE
// The capture is thread-local, which forbids cudaMalloc on the capturing
// thread; the pool's fresh cudaMalloc (a size no pool or cache holds) runs
// in relaxed mode and the thread's mode is thread-local again after it.
// Before the fix this died as "out of memory on cuda:0".
TEST_F(GraphCaptureTest, FreshAllocationInsideCaptureSucceeds) {
  ::mcc::cuda::CudaAllocator* alloc = ::mcc::cuda::GetCudaAllocator(0);
  const Tensor src_host = RandomHost({777777}, DType::kFloat32, 21);
  Tensor src = ToCuda(src_host);
  Tensor out = Tensor::Zeros({777777}, DType::kFloat32, Device::CUDA(0));
  const int64_t mallocs_before = alloc->CudaMallocCalls();
  ASSERT_TRUE(BeginGraphCapture(Device::CUDA(0)).ok());
  {
    Tensor tmp = Tensor::Empty({777777}, DType::kFloat32, Device::CUDA(0));
    cudaStreamCaptureMode mode = cudaStreamCaptureModeThreadLocal;
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    EXPECT_EQ(mode, cudaStreamCaptureModeThreadLocal);
    ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
    ASSERT_TRUE(Scale(src, 3.0f, &tmp).ok());
    ASSERT_TRUE(Scale(tmp, 1.0f, &out).ok());
  }
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_GT(alloc->CudaMallocCalls(), mallocs_before);
  ASSERT_TRUE(graph->Replay().ok());
  std::vector<double> want = src_host.ToDoubles();
  for (double& v : want) v = static_cast<float>(v * 3.0);
  EXPECT_EQ(Values(out), want);
}

TEST_F(GraphCaptureTest, CapturesOnANonDefaultCurrentStream) {
  absl::StatusOr<::mcc::cuda::Stream> stream = ::mcc::cuda::Stream::Create(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  ::mcc::cuda::StreamGuard guard(0, stream->get());
  Tensor x = ToCuda(RandomHost({256}, DType::kFloat32, 13));
  Tensor y = Tensor::Zeros({256}, DType::kFloat32, Device::CUDA(0));
  ASSERT_TRUE(BeginGraphCapture(Device::CUDA(0)).ok());
  EXPECT_EQ(::mcc::cuda::CurrentStream(0), stream->get());
  ASSERT_TRUE(Scale(x, 3.0f, &y).ok());
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(graph->Replay().ok());
  std::vector<double> want = Values(x);
  for (double& v : want) v = static_cast<float>(v * 3.0);
  EXPECT_EQ(Values(y), want);
}
#endif

}  // namespace
}  // namespace testing
}  // namespace cuda
}  // namespace ops
}  // namespace mcc
