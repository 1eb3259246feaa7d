// The device-generic graph capture API (core/graph_capture.h) on the test
// device, whose capture records kernel calls instead of running them, as
// CUDA does: what a graph replays, what it refuses, and the mistakes a
// caller can make (an input not copied in, a host read inside the capture).
#include "core/graph_capture.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "core/ops/elementwise.h"
#include "core/ops/index_check.h"
#include "core/ops/reduce.h"
#include "core/tensor.h"
#include "core/testing/test_device.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

namespace mcc {
namespace {

const Device kDev = Device::TestDevice(0);

Tensor OnDevice(const std::vector<float>& values) {
  absl::StatusOr<Tensor> host =
      Tensor::FromVector(values, {static_cast<int64_t>(values.size())});
  CHECK(host.ok()) << host.status();
  absl::StatusOr<Tensor> dev = host->To(kDev);
  CHECK(dev.ok()) << dev.status();
  return *dev;
}

// Captures y = 2 * x + b into `y` (a temporary made inside the capture).
absl::StatusOr<DeviceGraph> CaptureScaleAdd(const Tensor& x, const Tensor& b,
                                            Tensor* y) {
  if (absl::Status s = BeginGraphCapture(kDev); !s.ok()) return s;
  Tensor scaled = Tensor::Empty(x.shape(), x.dtype(), kDev);
  absl::Status s = ops::Scale(x, 2.0f, &scaled);
  if (s.ok()) s = ops::Add(scaled, b, y);
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  if (!s.ok()) return s;
  return graph;
}

TEST(GraphCaptureTest, CpuCannotCapture) {
  absl::Status s = BeginGraphCapture(Device::CPU());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_FALSE(IsCapturingGraph());
  EXPECT_TRUE(GraphCaptureSupported(DeviceType::kTestDevice));
  EXPECT_FALSE(GraphCaptureSupported(DeviceType::kCPU));
}

TEST(GraphCaptureTest, CaptureRunsNothingAndReplayRunsEverything) {
  Tensor x = OnDevice({1, 2, 3});
  Tensor b = OnDevice({10, 20, 30});
  Tensor y = OnDevice({-1, -1, -1});
  absl::StatusOr<DeviceGraph> graph = CaptureScaleAdd(x, b, &y);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_FALSE(IsCapturingGraph());
  // Nothing ran while capturing.
  EXPECT_EQ(y.ToDoubles(), (std::vector<double>{-1, -1, -1}));
  const int64_t replayed = testing::TestDeviceReplayedCalls();
  ASSERT_TRUE(graph->Replay().ok());
  EXPECT_EQ(testing::TestDeviceReplayedCalls() - replayed, 2);  // Scale, Add
  EXPECT_EQ(y.ToDoubles(), (std::vector<double>{12, 24, 36}));
  // New inputs copied into the static input: the next replay sees them.
  ASSERT_TRUE(x.CopyFrom(OnDevice({5, 6, 7})).ok());
  ASSERT_TRUE(graph->Replay().ok());
  EXPECT_EQ(y.ToDoubles(), (std::vector<double>{20, 32, 44}));
}

TEST(GraphCaptureTest, AnInputNotCopiedInIsNotSeen) {
  // The planted fault: the caller makes a new input tensor instead of
  // copying into the captured one. The replay still reads the old input,
  // so its result differs from the eager one, which a parity test catches.
  Tensor x = OnDevice({1, 2, 3});
  Tensor b = OnDevice({0, 0, 0});
  Tensor y = Tensor::Zeros({3}, DType::kFloat32, kDev);
  absl::StatusOr<DeviceGraph> graph = CaptureScaleAdd(x, b, &y);
  ASSERT_TRUE(graph.ok()) << graph.status();
  x = OnDevice({4, 4, 4});  // Rebinds the handle; the graph keeps the old.
  ASSERT_TRUE(graph->Replay().ok());
  Tensor eager = Tensor::Zeros({3}, DType::kFloat32, kDev);
  ASSERT_TRUE(ops::Scale(x, 2.0f, &eager).ok());
  EXPECT_EQ(y.ToDoubles(), (std::vector<double>{2, 4, 6}));
  EXPECT_NE(y.ToDoubles(), eager.ToDoubles());
}

TEST(GraphCaptureTest, ReplaysAccumulate) {
  Tensor grad = OnDevice({1, 2});
  Tensor main_grad = Tensor::Zeros({2}, DType::kFloat32, kDev);
  ASSERT_TRUE(BeginGraphCapture(kDev).ok());
  ASSERT_TRUE(ops::Accumulate(grad, 1.0f, &main_grad).ok());
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(graph->Replay().ok());
  EXPECT_EQ(main_grad.ToDoubles(), (std::vector<double>{3, 6}));
}

TEST(GraphCaptureTest, DeviceCopiesAreRecordedAndTheirMemoryKept) {
  Tensor src = OnDevice({1, 2, 3, 4});
  Tensor out = Tensor::Zeros({4}, DType::kFloat32, kDev);
  ASSERT_TRUE(BeginGraphCapture(kDev).ok());
  {
    // A temporary made and dropped inside the capture: its memory must
    // outlive the capture, as a CUDA graph's private pool does.
    Tensor tmp = Tensor::Empty({4}, DType::kFloat32, kDev);
    ASSERT_TRUE(tmp.CopyFrom(src).ok());
    ASSERT_TRUE(out.CopyFrom(tmp).ok());
  }
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_EQ(out.ToDoubles(), (std::vector<double>{0, 0, 0, 0}));
  // Other allocations between capture and replay must not take its memory.
  std::vector<Tensor> others;
  for (int i = 0; i < 8; ++i) others.push_back(OnDevice({-9, -9, -9, -9}));
  ASSERT_TRUE(graph->Replay().ok());
  EXPECT_EQ(out.ToDoubles(), (std::vector<double>{1, 2, 3, 4}));
  for (const Tensor& t : others) {
    EXPECT_EQ(t.ToDoubles(), (std::vector<double>{-9, -9, -9, -9}));
  }
}

TEST(GraphCaptureTest, HostReadInsideCaptureFailsAndSpoilsTheCapture) {
  Tensor x = OnDevice({1, 2});
  ASSERT_TRUE(BeginGraphCapture(kDev).ok());
  absl::StatusOr<Tensor> host = x.To(Device::CPU());
  EXPECT_EQ(host.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(host.status().message(), "graph capture"))
      << host.status();
  // Even when the caller ignores that error, the capture reports it.
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  EXPECT_EQ(graph.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(graph.status().message(), "testdev:0 to cpu"))
      << graph.status();
  EXPECT_FALSE(IsCapturingGraph());
}

TEST(GraphCaptureTest, HostWriteAndValueReturningKernelsAreRefused) {
  Tensor x = OnDevice({1, 2});
  ASSERT_TRUE(BeginGraphCapture(kDev).ok());
  absl::Status copy = x.CopyFrom(*Tensor::FromVector({3, 4}, {2}));
  EXPECT_EQ(copy.code(), absl::StatusCode::kFailedPrecondition) << copy;
  absl::StatusOr<double> sum = ops::Sum(x);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(sum.status().message(), "returns a value"))
      << sum.status();
  EXPECT_FALSE(EndGraphCapture().ok());
  // Outside a capture both work again.
  ASSERT_TRUE(ops::Sum(x).ok());
  EXPECT_EQ(*ops::Sum(x), 3.0);
}

TEST(GraphCaptureTest, IndexChecksAreRefusedUnlessCheckedOutside) {
  Tensor ids = *(*Tensor::FromInts({1, 2}, {2}, DType::kInt64)).To(kDev);
  ASSERT_TRUE(BeginGraphCapture(kDev).ok());
  absl::Status check = ops::CheckIndexRange(ids, 4, -1, "token id");
  EXPECT_EQ(check.code(), absl::StatusCode::kFailedPrecondition) << check;
  EXPECT_FALSE(EndGraphCapture().ok());

  GraphCaptureOptions options;
  options.index_inputs_checked_outside = true;
  ASSERT_TRUE(BeginGraphCapture(kDev, options).ok());
  EXPECT_TRUE(ops::CheckIndexRange(ids, 4, -1, "token id").ok());
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(graph->Replay().ok());  // Nothing was recorded for the check.
}

TEST(GraphCaptureTest, MisuseIsReported) {
  EXPECT_EQ(EndGraphCapture().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(DeviceGraph().Replay().ok());
  Tensor x = OnDevice({1});
  Tensor y = OnDevice({0});
  ASSERT_TRUE(BeginGraphCapture(kDev).ok());
  EXPECT_EQ(BeginGraphCapture(kDev).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(ops::Scale(x, 3.0f, &y).ok());
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(BeginGraphCapture(kDev).ok());
  EXPECT_EQ(graph->Replay().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(EndGraphCapture().ok());
  // A moved-from graph is empty; the moved-to one replays.
  DeviceGraph moved = std::move(*graph);
  EXPECT_FALSE(graph->valid());
  ASSERT_TRUE(moved.Replay().ok());
  EXPECT_EQ(y.ToDoubles(), (std::vector<double>{3}));
}

absl::Status FailingScale(const Tensor&, float, Tensor*) {
  return absl::InternalError("planted kernel failure");
}

TEST(GraphCaptureTest, ReplayReportsTheFailingOp) {
  // A kernel error happens at replay (the call only recorded it), and the
  // replay names the op.
  Tensor x = OnDevice({1, 2});
  Tensor y = OnDevice({0, 0});
  ops::ScaleKernels().Register(DeviceType::kTestDevice, &FailingScale);
  ASSERT_TRUE(BeginGraphCapture(kDev).ok());
  absl::Status recorded = ops::Scale(x, 2.0f, &y);
  absl::StatusOr<DeviceGraph> graph = EndGraphCapture();
  ops::ScaleKernels().Register(DeviceType::kTestDevice, nullptr);
  ASSERT_TRUE(recorded.ok()) << recorded;
  ASSERT_TRUE(graph.ok()) << graph.status();
  ops::ScaleKernels().Register(DeviceType::kTestDevice, &FailingScale);
  absl::Status replay = graph->Replay();
  ops::ScaleKernels().Register(DeviceType::kTestDevice, nullptr);
  EXPECT_EQ(replay.code(), absl::StatusCode::kInternal) << replay;
  EXPECT_TRUE(absl::StrContains(replay.message(), "Scale")) << replay;
  EXPECT_TRUE(absl::StrContains(replay.message(), "planted")) << replay;
}

}  // namespace
}  // namespace mcc
