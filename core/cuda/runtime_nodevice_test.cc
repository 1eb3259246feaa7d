// Behaviour of the CUDA runtime library on a machine without a GPU: no
// crash at start-up, a device count of 0, and errors (not segfaults) that say
// no CUDA device was found.
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/cuda/cuda_allocator.h"
#include "core/cuda/cuda_status.h"
#include "core/cuda/device_copy.h"
#include "core/cuda/event.h"
#include "core/cuda/runtime.h"
#include "core/cuda/stream.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace cuda {
namespace {

absl::Status FailingCall() {
  MCC_CUDA_RETURN_IF_ERROR(cudaErrorInvalidValue);
  return absl::OkStatus();
}

// Independent of any device: the macro names the call, the CUDA error and
// the file:line.
TEST(CudaStatusTest, MacroNamesCallErrorAndLocation) {
  const absl::Status status = FailingCall();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      absl::StrContains(status.message(), "cudaErrorInvalidValue failed at"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "runtime_nodevice_test.cc:"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(),
                                cudaGetErrorString(cudaErrorInvalidValue)))
      << status;
  EXPECT_EQ(
      CudaErrorToStatus(cudaErrorMemoryAllocation, "cudaMalloc", "f", 1).code(),
      absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CudaErrorToStatus(cudaSuccess, "x", "f", 1).ok());
}

TEST(CudaAllocatorTest, RoundSizeClasses) {
  EXPECT_EQ(CudaAllocator::RoundSize(0), 512u);
  EXPECT_EQ(CudaAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CudaAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CudaAllocator::RoundSize(1 << 20), size_t{1} << 20);
  EXPECT_EQ(CudaAllocator::RoundSize((1 << 20) + 1), size_t{2} << 20);
  for (size_t b :
       {size_t{7}, size_t{4097}, size_t{3} << 20, size_t{12345678}}) {
    EXPECT_GE(CudaAllocator::RoundSize(b), b);
  }
}

// Why no device is seen reads as what CUDA said, never as silence: the GPU
// checks print it (and MCC_EXPECT_CUDA makes it fatal there).
TEST(NoDeviceReasonTest, NamesTheCudaErrorOrTheEmptyCount) {
  EXPECT_EQ(NoDeviceReason(cudaErrorInsufficientDriver, 0),
            absl::StrCat("cudaGetDeviceCount failed with "
                         "cudaErrorInsufficientDriver (",
                         cudaGetErrorString(cudaErrorInsufficientDriver), ")"));
  EXPECT_EQ(NoDeviceReason(cudaSuccess, 0),
            "cudaGetDeviceCount found 0 devices");
  EXPECT_EQ(NoDeviceReason(cudaSuccess, 2), "");
  EXPECT_EQ(NoCudaDeviceReason().empty(), CudaDeviceCount() > 0);
}

TEST(NoDeviceReasonTest, ExpectCudaReadsTheEnvironment) {
  const char* saved = std::getenv("MCC_EXPECT_CUDA");
  const std::string restore = saved == nullptr ? "" : saved;
  for (const auto& [value, want] : std::vector<std::pair<const char*, bool>>{
           {"1", true}, {"yes", true}, {"0", false}, {"", false}}) {
    setenv("MCC_EXPECT_CUDA", value, 1);
    EXPECT_EQ(CudaExpected(), want) << "MCC_EXPECT_CUDA=" << value;
  }
  unsetenv("MCC_EXPECT_CUDA");
  EXPECT_FALSE(CudaExpected());
  if (saved != nullptr) setenv("MCC_EXPECT_CUDA", restore.c_str(), 1);
}

class NoDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() > 0) {
      GTEST_SKIP() << "a CUDA device is present: the no-device paths are "
                      "checked on machines without one";
    }
  }
};

TEST_F(NoDeviceTest, DeviceCountIsZero) {
  EXPECT_EQ(CudaDeviceCount(), 0);
  const absl::Status status = CheckDeviceIndex(0);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(status.message(), "no CUDA device: cuda:0"))
      << status;
  EXPECT_TRUE(absl::StrContains(status.message(), NoCudaDeviceReason()))
      << status;
  EXPECT_FALSE(DeviceDescription(0).ok());
  EXPECT_FALSE(Synchronize(0).ok());
}

TEST_F(NoDeviceTest, EmptyOnGivesError) {
  absl::StatusOr<Tensor> t = EmptyOn({3, 5}, DType::kFloat32, Device::CUDA(0));
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      absl::StrContains(t.status().message(),
                        "no CUDA device: cannot allocate fp32[3, 5] on cuda:0"))
      << t.status();
  // CPU tensors are unaffected.
  absl::StatusOr<Tensor> cpu = EmptyOn({2}, DType::kFloat32, Device::CPU());
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->numel(), 2);
}

TEST_F(NoDeviceTest, TensorEmptyDiesWithClearMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(Tensor::Empty({4, 7}, DType::kBFloat16, Device::CUDA(0)),
               "no CUDA device: cannot allocate 56 B \\(56 bytes\\) on cuda:0");
}

TEST_F(NoDeviceTest, CopyAndStreamsGiveErrors) {
  float host[4] = {1, 2, 3, 4};
  const absl::Status copy =
      CopyOnCurrentStream(reinterpret_cast<void*>(0x1000), Device::CUDA(0),
                          host, Device::CPU(), sizeof(host));
  EXPECT_EQ(copy.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(copy.message(), "from cpu to cuda:0")) << copy;
  EXPECT_TRUE(absl::StrContains(copy.message(), "no CUDA device")) << copy;
  EXPECT_FALSE(Stream::Create(0).ok());
  EXPECT_FALSE(Event::Create(0).ok());
  // The registered copier is found by CopyBytes (no "link" error), and the
  // default current stream is the legacy default stream.
  EXPECT_EQ(CurrentStream(0), nullptr);
}

}  // namespace
}  // namespace cuda
}  // namespace mcc
