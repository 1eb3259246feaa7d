// CUDA runtime checks that need a device: allocator caching and statistics,
// host/device/device copies, streams and events. Skips without a device.
#include "core/cuda/runtime.h"

#include <cuda_runtime.h>

#include <chrono>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "core/cuda/cuda_allocator.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/device_copy.h"
#include "core/cuda/event.h"
#include "core/cuda/stream.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace cuda {
namespace {

std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST(CudaRuntimeTest, DescribesDevice) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: DescribesDevice skipped";
  absl::StatusOr<std::string> d = DeviceDescription(0);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(absl::StrContains(*d, "sm_")) << *d;
  EXPECT_FALSE(CheckDeviceIndex(CudaDeviceCount()).ok());
}

TEST(CudaRuntimeTest, RoundTripCopiesPreserveValues) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: RoundTripCopiesPreserveValues skipped";
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    const std::vector<float> values = RandomFloats(1237, 7);
    absl::StatusOr<Tensor> host = Tensor::FromVector(values, {1237}, dtype);
    ASSERT_TRUE(host.ok());
    absl::StatusOr<Tensor> dev = host->To(Device::CUDA(0));
    ASSERT_TRUE(dev.ok()) << dev.status();
    EXPECT_EQ(dev->device(), Device::CUDA(0));
    Tensor dev2 = dev->Clone();  // device to device
    ASSERT_FALSE(dev2.SharesStorageWith(*dev));
    absl::StatusOr<Tensor> back = dev2.To(Device::CPU());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->ToDoubles(), host->ToDoubles()) << DTypeName(dtype);
  }
  // Slices copy from their offset.
  absl::StatusOr<Tensor> host =
      Tensor::FromVector(RandomFloats(60, 3), {12, 5});
  ASSERT_TRUE(host.ok());
  Tensor dev = *host->To(Device::CUDA(0));
  Tensor rows = *dev.Slice(3, 7);
  std::vector<double> got = rows.ToDoubles();
  std::vector<double> want = host->Slice(3, 7)->ToDoubles();
  EXPECT_EQ(got, want);
  // Fill and Zero go through the host.
  dev.Fill(2.5);
  for (double v : dev.ToDoubles()) ASSERT_EQ(v, 2.5);
  dev.Zero();
  for (double v : dev.ToDoubles()) ASSERT_EQ(v, 0.0);
}

TEST(CudaRuntimeTest, AllocatorCachesAndCounts) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: AllocatorCachesAndCounts skipped";
  CudaAllocator* alloc = GetCudaAllocator(0);
  ASSERT_NE(alloc, nullptr);
  const MemoryStats before = alloc->Stats();
  { Tensor warm = Tensor::Empty({1000, 3}, DType::kFloat32, Device::CUDA(0)); }
  const int64_t calls = alloc->CudaMallocCalls();
  for (int step = 0; step < 10; ++step) {
    Tensor a = Tensor::Empty({1000, 3}, DType::kFloat32, Device::CUDA(0));
    EXPECT_EQ(alloc->Stats().current_bytes, before.current_bytes + 12000);
  }
  EXPECT_EQ(alloc->CudaMallocCalls(), calls) << "freed blocks were not reused";
  EXPECT_EQ(alloc->Stats().current_bytes, before.current_bytes);
  EXPECT_GE(alloc->Stats().peak_bytes, before.current_bytes + 12000);
  EXPECT_GE(alloc->CachedBytes(),
            static_cast<int64_t>(CudaAllocator::RoundSize(12000)));
  alloc->EmptyCache();
  EXPECT_EQ(alloc->CachedBytes(), 0);
  EXPECT_GE(alloc->ReservedBytes(), alloc->Stats().current_bytes);
  // Two live tensors of one size class get different blocks.
  Tensor a = Tensor::Zeros({100}, DType::kFloat32, Device::CUDA(0));
  Tensor b = Tensor::Full({100}, 1.0, DType::kFloat32, Device::CUDA(0));
  EXPECT_NE(a.raw_data(), b.raw_data());
  for (double v : a.ToDoubles()) ASSERT_EQ(v, 0.0);
}

TEST(CudaRuntimeTest, HugeAllocationFailsWithStatus) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: HugeAllocationFailsWithStatus skipped";
  void* p = nullptr;
  auto try_alloc = [&]() -> absl::Status {
    MCC_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, size_t{1} << 50));
    return absl::OkStatus();
  };
  const absl::Status status = try_alloc();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_TRUE(
      absl::StrContains(status.message(), "cudaMalloc(&p, size_t{1} << 50)"))
      << status;
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "sticky error left behind";
}

TEST(CudaRuntimeTest, StreamsAndEvents) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: StreamsAndEvents skipped";
  absl::StatusOr<Stream> stream = Stream::Create(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  EXPECT_EQ(CurrentStream(0), nullptr);
  const std::vector<float> values = RandomFloats(1 << 20, 11);
  Tensor host = *Tensor::FromVector(values, {1 << 20});
  Tensor dev = Tensor::Empty({1 << 20}, DType::kFloat32, Device::CUDA(0));
  {
    StreamGuard guard(0, stream->get());
    EXPECT_EQ(CurrentStream(0), stream->get());
    absl::StatusOr<Event> start = Event::Create(0);
    absl::StatusOr<Event> end = Event::Create(0);
    ASSERT_TRUE(start.ok() && end.ok());
    ASSERT_TRUE(start->Record().ok());
    ASSERT_TRUE(dev.CopyFrom(host).ok());
    Tensor dev2 = dev.Clone();
    ASSERT_TRUE(end->Record().ok());
    ASSERT_TRUE(end->Synchronize().ok());
    absl::StatusOr<float> ms = end->ElapsedMsSince(*start);
    ASSERT_TRUE(ms.ok()) << ms.status();
    EXPECT_GT(*ms, 0.0f);
    EXPECT_LT(*ms, 10000.0f);
    EXPECT_EQ(dev2.ToDoubles(), host.ToDoubles());
  }
  EXPECT_EQ(CurrentStream(0), nullptr);
  // An event orders a second stream after the first.
  absl::StatusOr<Stream> other = Stream::Create(0);
  absl::StatusOr<Event> done = Event::Create(0, /*timing=*/false);
  ASSERT_TRUE(other.ok() && done.ok());
  Tensor dst = Tensor::Empty({1 << 20}, DType::kFloat32, Device::CUDA(0));
  ASSERT_TRUE(Copy(dst.raw_data(), dst.device(), dev.raw_data(), dev.device(),
                   dev.nbytes(), stream->get())
                  .ok());
  ASSERT_TRUE(done->Record(stream->get()).ok());
  ASSERT_TRUE(done->WaitOn(other->get()).ok());
  std::vector<float> out(1 << 20);
  ASSERT_TRUE(Copy(out.data(), Device::CPU(), dst.raw_data(), dst.device(),
                   dst.nbytes(), other->get())
                  .ok());
  EXPECT_EQ(out, values);
}

void CUDART_CB SleepOnStream(void* ms) {
  std::this_thread::sleep_for(
      std::chrono::milliseconds(*static_cast<int*>(ms)));
}

TEST(CudaRuntimeTest, AllocatorReusesPerStream) {
  if (CudaDeviceCount() == 0)
    GTEST_SKIP() << "no CUDA device: AllocatorReusesPerStream skipped";
  CudaAllocator* alloc = GetCudaAllocator(0);
  absl::StatusOr<Stream> s1 = Stream::Create(0);
  absl::StatusOr<Stream> s2 = Stream::Create(0);
  ASSERT_TRUE(s1.ok() && s2.ok());
  // An odd size class no other test uses.
  const Shape shape{777, 13};
  void* first = nullptr;
  {
    StreamGuard guard(0, s1->get());
    Tensor a = Tensor::Empty(shape, DType::kFloat32, Device::CUDA(0));
    first = a.raw_data();
  }
  {
    // Freed on s1: another stream does not get it...
    StreamGuard guard(0, s2->get());
    Tensor b = Tensor::Empty(shape, DType::kFloat32, Device::CUDA(0));
    EXPECT_NE(b.raw_data(), first);
  }
  {
    // ...s1 does, at once.
    StreamGuard guard(0, s1->get());
    Tensor c = Tensor::Empty(shape, DType::kFloat32, Device::CUDA(0));
    EXPECT_EQ(c.raw_data(), first);
  }
  EXPECT_EQ(alloc->PendingBytes(), 0);
}

TEST(CudaRuntimeTest, RecordStreamDefersReuseUntilTheStreamIsDone) {
  if (CudaDeviceCount() == 0) {
    GTEST_SKIP()
        << "no CUDA device: RecordStreamDefersReuseUntilTheStreamIsDone "
           "skipped";
  }
  CudaAllocator* alloc = GetCudaAllocator(0);
  absl::StatusOr<Stream> mine = Stream::Create(0);
  absl::StatusOr<Stream> side = Stream::Create(0);
  ASSERT_TRUE(mine.ok() && side.ok());
  StreamGuard guard(0, mine->get());
  const Shape shape{555, 7};
  const std::vector<float> values = RandomFloats(555 * 7, 11);
  Tensor x = *Tensor::FromVector(values, shape)->To(Device::CUDA(0));
  void* block = x.raw_data();
  // The side stream reads x after a stall; x is freed meanwhile.
  static int ms = 300;
  ASSERT_EQ(cudaLaunchHostFunc(side->get(), &SleepOnStream, &ms), cudaSuccess);
  Tensor copy = Tensor::Empty(shape, DType::kFloat32, Device::CUDA(0));
  ASSERT_TRUE(Copy(copy.raw_data(), copy.device(), x.raw_data(), x.device(),
                   x.nbytes(), side->get())
                  .ok());
  ASSERT_TRUE(RecordStream(x, side->get()).ok());
  // A view records the block it lies in.
  ASSERT_TRUE(
      alloc->RecordStream(static_cast<char*>(block) + 100, side->get()).ok());
  x = Tensor();
  EXPECT_GE(alloc->PendingBytes(),
            static_cast<int64_t>(CudaAllocator::RoundSize(555 * 7 * 4)));
  {
    // Overwriting the block now would corrupt the side stream's read.
    Tensor y = Tensor::Full(shape, -1.0, DType::kFloat32, Device::CUDA(0));
    EXPECT_NE(y.raw_data(), block);
  }
  ASSERT_TRUE(side->Synchronize().ok());
  EXPECT_EQ(copy.To(Device::CPU())->ToFloats(), values);
  Tensor z = Tensor::Empty(shape, DType::kFloat32, Device::CUDA(0));
  EXPECT_EQ(z.raw_data(), block)
      << "the block came back once the stream was done";
  EXPECT_EQ(alloc->PendingBytes(), 0);
  EXPECT_FALSE(
      RecordStream(Tensor::Zeros({2}, DType::kFloat32), side->get()).ok());
}

}  // namespace
}  // namespace cuda
}  // namespace mcc
