// Activation offloading on a GPU (core/activation_offload.h through the
// CUDA side-stream hooks, core/cuda/side_stream_hooks.cc): a real
// non-blocking side stream, values back bit for bit when the compute stream
// is a stream of its own, and device memory returned when the offloader
// says. Needs a device; skips without one.
#include "core/activation_offload.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "core/allocator.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace cuda {
namespace {

TEST(CudaActivationOffloadTest, LayersComeBackBitForBit) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::CUDA(0);
  auto compute = Stream::Create(0);
  ASSERT_TRUE(compute.ok()) << compute.status();
  StreamGuard guard(0, compute->get());
  auto offloader = ActivationOffloader::Create(dev);
  ASSERT_TRUE(offloader.ok()) << offloader.status();
  EXPECT_TRUE((*offloader)->asynchronous());

  // Four "layers" of 16 MiB (odd element counts), offloaded in order and
  // restored in reverse with the next one prefetched, as the model does.
  constexpr int kLayers = 4;
  const int64_t n = (4 << 20) + 3;
  std::vector<std::vector<float>> want(kLayers);
  std::vector<Tensor> slots(kLayers);
  std::vector<std::unique_ptr<ActivationOffloader::Group>> groups;
  Allocator* allocator = GetAllocator(dev);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kLayers; ++i) {
    want[i].resize(n);
    for (int64_t k = 0; k < n; ++k) {
      want[i][k] = static_cast<float>((k * 7 + i * 13) % 1001) - 500.0f;
    }
    slots[i] = *Tensor::FromVector(want[i], {n})->To(dev);
    auto g = (*offloader)->Offload({&slots[i]});
    ASSERT_TRUE(g.ok()) << g.status();
    groups.push_back(std::move(*g));
  }
  const int64_t held = allocator->Stats().current_bytes;
  ASSERT_TRUE((*offloader)->ReleaseOffloaded().ok());
  EXPECT_EQ(held - allocator->Stats().current_bytes, n * 4)
      << "the last layer's device memory is released after its copy";
  for (int i = kLayers - 1; i >= 0; --i) {
    ASSERT_TRUE((*offloader)->Restore(groups[i].get(), {&slots[i]}).ok());
    if (i > 0) {
      ASSERT_TRUE((*offloader)->Prefetch(groups[i - 1].get()).ok());
    }
    EXPECT_EQ(slots[i].To(Device::CPU())->ToFloats(), want[i]) << i;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  const OffloadStats s = (*offloader)->stats();
  EXPECT_EQ(s.bytes, kLayers * n * 4);
  EXPECT_EQ(s.restored_bytes, kLayers * n * 4);
  std::printf("offloaded and restored %s in %.1f ms (with the checks)\n",
              FormatBytes(s.bytes).c_str(), seconds * 1e3);
}

}  // namespace
}  // namespace cuda
}  // namespace mcc
