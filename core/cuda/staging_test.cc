// The CUDA staging hooks (core/cuda/staging.cc) behind PinnedStagingPool:
// page-locked buffers, copies on the thread's current stream, values that
// arrive. Needs a device; skips without one.
#include <cuda_runtime.h>

#include <chrono>
#include <thread>
#include <vector>

#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/device_staging.h"
#include "core/pinned_staging_pool.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace cuda {
namespace {

TEST(CudaStagingTest, PinnedMemoryIsPageLocked) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  void* p = AllocatePinnedHost(Device::CUDA(0), 4096);
  ASSERT_NE(p, nullptr);
  cudaPointerAttributes attr;
  ASSERT_EQ(cudaPointerGetAttributes(&attr, p), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  FreePinnedHost(Device::CUDA(0), p);
}

TEST(CudaStagingTest, StagedTensorsArriveOnTheCurrentStream) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto stream = Stream::Create(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  StreamGuard guard(0, stream->get());
  PinnedStagingPool pool(Device::CUDA(0));
  for (int step = 0; step < 3; ++step) {
    std::vector<float> values(1 << 20);
    for (size_t i = 0; i < values.size(); ++i) {
      values[i] = static_cast<float>(step * 7 + i % 1000);
    }
    Tensor host = *Tensor::FromVector(values, {1 << 20});
    auto staged = pool.Stage(host);
    ASSERT_TRUE(staged.ok()) << staged.status();
    host.Fill(-1.0);  // The pinned copy, not the source, feeds the device.
    // The read to the host runs on the same stream, after the copy.
    EXPECT_EQ(staged->To(Device::CPU())->ToFloats(), values) << step;
    ASSERT_TRUE(pool.Recycle().ok());
  }
  EXPECT_EQ(pool.num_buffers(), 1);
}

void CUDART_CB SleepOnStream(void* ms) {
  std::this_thread::sleep_for(
      std::chrono::milliseconds(*static_cast<int*>(ms)));
}

TEST(CudaStagingTest, StagingDoesNotBlockTheHost) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  auto stream = Stream::Create(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  StreamGuard guard(0, stream->get());
  PinnedStagingPool pool(Device::CUDA(0));
  std::vector<float> values(1 << 18);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.5f * (i % 513);
  Tensor host = *Tensor::FromVector(values, {1 << 18});
  // Warm the pool (its first pinned allocation may synchronise).
  ASSERT_TRUE(pool.Stage(host).ok());
  ASSERT_TRUE(pool.Recycle().ok());
  // With the current stream stalled, Stage only queues the copy.
  static int ms = 400;
  ASSERT_EQ(cudaLaunchHostFunc(stream->get(), &SleepOnStream, &ms),
            cudaSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  auto staged = pool.Stage(host);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_LT(took, 0.2) << "Stage waited for the stream";
  EXPECT_EQ(pool.num_in_flight(), 1);
  EXPECT_EQ(staged->To(Device::CPU())->ToFloats(), values);
  ASSERT_TRUE(pool.Recycle().ok());
}

}  // namespace
}  // namespace cuda
}  // namespace mcc
