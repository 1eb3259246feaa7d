// NCCL backend on one GPU (world size 1; NCCL refuses two ranks on one
// device): values, ordering against the caller's current stream, Wait that
// does not block the host, the current device left as found, and a timeout
// that names the operation. Skips where no CUDA device is present.
#include "core/comm/nccl_process_group.h"

#include <cuda_runtime.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "core/comm/tcp_store.h"
#include "core/cuda/stream.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

void CUDART_CB SleepOnStream(void* ms) {
  std::this_thread::sleep_for(
      std::chrono::milliseconds(*static_cast<int*>(ms)));
}

// Holds `stream` for `ms` milliseconds (the host is not blocked).
void Stall(cudaStream_t stream, int* ms) {
  ASSERT_EQ(cudaLaunchHostFunc(stream, &SleepOnStream, ms), cudaSuccess);
}

class NcclTest : public ::testing::Test {
 protected:
  std::shared_ptr<ProcessGroup> NewGroup(const std::string& name,
                                         GroupOptions g) {
    auto group = CreateNcclProcessGroup(
        std::make_shared<PrefixStore>(name, store_), 0, 1, name, {0}, g, 0);
    EXPECT_TRUE(group.ok()) << group.status();
    return group.ok() ? *group : nullptr;
  }

  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device: NCCL backend tests skipped";
    }
    TcpStore::Options o;
    o.is_server = true;
    o.rank = 0;
    o.timeout = absl::Seconds(30);
    store_ = TcpStore::Connect(o).value();
    GroupOptions g;
    g.timeout = absl::Seconds(30);
    group_ = CreateNcclProcessGroup(std::make_shared<PrefixStore>("w", store_),
                                    0, 1, "world", {0}, g, 0)
                 .value();
  }
  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<ProcessGroup> group_;
};

TEST_F(NcclTest, CollectivesOnOneRankMatchTheInput) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                   DType::kInt32, DType::kInt64, DType::kInt8}) {
    std::vector<float> v(7);
    std::iota(v.begin(), v.end(), -3.0f);
    Tensor host = Tensor::FromVector(v, {7}, dt).value();
    Tensor t = host.To(Device::CUDA(0)).value();
    ASSERT_TRUE(group_->AllReduceSync(&t, ReduceOp::kSum).ok());
    EXPECT_EQ(t.To(Device::CPU()).value().ToDoubles(), host.ToDoubles());
    Tensor out = Tensor::Empty({7}, dt, Device::CUDA(0));
    ASSERT_TRUE(group_->AllGatherSync(t, &out).ok());
    EXPECT_EQ(out.To(Device::CPU()).value().ToDoubles(), host.ToDoubles());
    ASSERT_TRUE(group_->ReduceScatterSync(t, &out, ReduceOp::kMax).ok());
    EXPECT_EQ(out.To(Device::CPU()).value().ToDoubles(), host.ToDoubles());
    ASSERT_TRUE(group_->BroadcastSync(&t, 0).ok());
    ASSERT_TRUE(group_->AllToAllSync(t, &out).ok());
    EXPECT_EQ(out.To(Device::CPU()).value().ToDoubles(), host.ToDoubles());
  }
  EXPECT_TRUE(group_->BarrierSync().ok());
}

TEST_F(NcclTest, OrdersAfterTheCurrentStreamWithoutBlockingTheHost) {
  auto stream = cuda::Stream::Create(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  cuda::StreamGuard guard(0, stream->get());
  for (int round = 0; round < 3; ++round) {
    std::vector<float> v(1001);
    std::iota(v.begin(), v.end(), static_cast<float>(round * 5000));
    const Tensor fresh =
        Tensor::FromVector(v, {1001}).value().To(Device::CUDA(0)).value();
    Tensor in = Tensor::Zeros({1001}, DType::kFloat32, Device::CUDA(0));
    Tensor out = Tensor::Empty({1001}, DType::kFloat32, Device::CUDA(0));
    // The current stream writes the input only after 300 ms: a collective
    // that does not wait for it gathers zeros.
    static int ms = 300;
    Stall(stream->get(), &ms);
    ASSERT_EQ(cudaMemcpyAsync(in.raw_data(), fresh.raw_data(), in.nbytes(),
                              cudaMemcpyDeviceToDevice, stream->get()),
              cudaSuccess);
    const auto t0 = std::chrono::steady_clock::now();
    auto work = group_->AllGather(in, &out);
    ASSERT_TRUE(work->Wait().ok());
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
            .count();
    EXPECT_LT(waited, 0.2) << "Wait blocked the host";
    EXPECT_FALSE(work->IsCompleted());
    // Read on the current stream, which Wait ordered after the gather.
    EXPECT_EQ(out.To(Device::CPU()).value().ToFloats(), v) << round;
    for (int i = 0; i < 2000 && !work->IsCompleted(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(work->IsCompleted());
  }
}

TEST_F(NcclTest, BlockingWaitReturnsOnceFinished) {
  GroupOptions g;
  g.timeout = absl::Seconds(30);
  g.blocking_wait = true;
  auto group = NewGroup("blocking", g);
  ASSERT_NE(group, nullptr);
  auto stream = cuda::Stream::Create(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  cuda::StreamGuard guard(0, stream->get());
  Tensor t = Tensor::Full({17}, 1.0, DType::kBFloat16, Device::CUDA(0));
  static int ms = 200;
  Stall(stream->get(), &ms);
  auto work = group->AllReduce(&t, ReduceOp::kSum);
  ASSERT_TRUE(work->Wait().ok());
  EXPECT_TRUE(work->IsCompleted());
}

TEST_F(NcclTest, LeavesTheCurrentDeviceAsFound) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "needs two CUDA devices";
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  Tensor t = Tensor::Full({5}, 1.0, DType::kFloat32, Device::CUDA(0));
  ASSERT_TRUE(group_->AllReduceSync(&t, ReduceOp::kSum).ok());
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

TEST_F(NcclTest, CpuTensorIsRefused) {
  Tensor t = Tensor::Zeros({3}, DType::kFloat32);
  absl::Status s = group_->AllReduceSync(&t, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("use a gloo group"), std::string::npos) << s;
}

// Last in this file: the communicator is aborted with an operation queued.
TEST_F(NcclTest, TimeoutNamesTheOperationAndBreaksTheGroup) {
  GroupOptions g;
  g.timeout = absl::Seconds(30);
  g.blocking_wait = true;
  auto group = NewGroup("stalled", g);
  ASSERT_NE(group, nullptr);
  auto stream = cuda::Stream::Create(0);
  ASSERT_TRUE(stream.ok()) << stream.status();
  cuda::StreamGuard guard(0, stream->get());
  ASSERT_TRUE(group->BarrierSync().ok());  // Sequence number 0.
  // The collective waits for the current stream, stalled past its timeout.
  static int ms = 3000;
  Stall(stream->get(), &ms);
  Tensor t = Tensor::Full({3}, 1.0, DType::kFloat32, Device::CUDA(0));
  CollectiveOptions o;
  o.timeout = absl::Seconds(1);
  absl::Status s = group->AllReduce(&t, ReduceOp::kSum, o)->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  for (const char* part : {"AllReduce(sum, fp32[3])", "sequence number 1",
                           "group 'stalled'", "rank 0 of 1", "timeout of 1s"}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << ": " << s;
  }
  absl::Status later = group->BarrierSync();
  EXPECT_EQ(later.code(), absl::StatusCode::kFailedPrecondition) << later;
  EXPECT_NE(later.message().find("AllReduce"), std::string::npos) << later;
  EXPECT_EQ(cudaStreamSynchronize(stream->get()), cudaSuccess);
}

}  // namespace
}  // namespace comm
}  // namespace mcc
