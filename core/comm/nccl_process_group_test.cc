// NCCL backend on one GPU (world size 1; NCCL refuses two ranks on one
// device). Skips where no CUDA device is present.
#include "core/comm/nccl_process_group.h"

#include <cuda_runtime.h>

#include <numeric>
#include <vector>

#include "core/comm/tcp_store.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace {

class NcclTest : public ::testing::Test {
 protected:
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
    group_ =
        NcclProcessGroup::Create(std::make_shared<PrefixStore>("w", store_), 0,
                                 1, "world", {0}, g, 0)
            .value();
  }
  std::shared_ptr<TcpStore> store_;
  std::shared_ptr<NcclProcessGroup> group_;
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

TEST_F(NcclTest, CpuTensorIsRefused) {
  Tensor t = Tensor::Zeros({3}, DType::kFloat32);
  absl::Status s = group_->AllReduceSync(&t, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("use a gloo group"), std::string::npos) << s;
}

}  // namespace
}  // namespace comm
}  // namespace mcc
