// The optimizer with its parameters, gradients, fp32 main weights and state
// on the test device (a device that is not the host,
// core/testing/test_device.h): AdamW and SGD on fp32, bf16 and fp16
// parameters with dynamic loss scaling (an overflow step skipped), clipping
// and zero counting must give the CPU run's parameters, state and step
// reports bit for bit, with exactly one device-to-host copy per Step (the
// gradient statistics) and none in ComputeGradStats / ApplyStep.
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"
#include "optim/optimizer.h"

namespace mcc {
namespace optim {
namespace {

using ::mcc::testing::TestDeviceCopiesFromHost;
using ::mcc::testing::TestDeviceCopiesToHost;

ParameterList MakeParams(DType dtype, Device device) {
  ParameterList params;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const std::vector<Shape> shapes = {{33, 17}, {17}, {4099}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<float> v(NumElements(shapes[i]));
    for (float& x : v) x = nd(rng);
    auto p = std::make_shared<Parameter>();
    p->name = "p" + std::to_string(i);
    p->value = *Tensor::FromVector(v, shapes[i], dtype)->To(device);
    p->main_grad = Tensor::Zeros(shapes[i], DType::kFloat32, device);
    p->global_shape = shapes[i];
    p->weight_decay = i != 1;
    params.push_back(p);
  }
  return params;
}

// Gradients of step `step`, scaled by the loss scale as backward leaves
// them, with a few exact zeros; step 1 overflows (an inf).
void SetGrads(const ParameterList& params, int step, double loss_scale) {
  std::mt19937 rng(100 + step);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (size_t k = 0; k < params.size(); ++k) {
    const Tensor& g = params[k]->main_grad;
    std::vector<float> v(g.numel());
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = i % 7 == 0 ? 0.0f : static_cast<float>(nd(rng) * loss_scale);
    }
    if (step == 1 && k == 2) v[5] = std::numeric_limits<float>::infinity();
    Tensor host = *Tensor::FromVector(v, g.shape());
    ASSERT_TRUE(params[k]->main_grad.CopyFrom(host).ok());
  }
}

std::vector<uint8_t> HostBytes(const Tensor& t) {
  Tensor host = t.device().is_cpu() ? t : *t.To(Device::CPU());
  std::vector<uint8_t> b(host.nbytes());
  std::memcpy(b.data(), host.raw_data(), b.size());
  return b;
}

struct TrainRun {
  std::vector<std::vector<uint8_t>> bytes;  // Parameters, then state.
  std::vector<std::string> steps;           // StepInfo as text.
};

TrainRun Train(OptimizerType type, DType dtype, Device device,
               StatePrecision precision = StatePrecision()) {
  TrainRun run;
  ParameterList params = MakeParams(dtype, device);
  OptimizerConfig config;
  config.type = type;
  config.clip_grad = 1.0;
  config.loss_scaling = true;
  config.loss_scaler.initial_scale = 256;
  config.loss_scaler.hysteresis = 1;
  config.log_num_zeros_in_grad = true;
  config.state_precision = precision;
  auto opt = Optimizer::Create(params, config, OptimizerGroups());
  EXPECT_TRUE(opt.ok()) << opt.status();
  if (!opt.ok()) return run;
  EXPECT_EQ((*opt)->device(), device);
  for (int step = 0; step < 4; ++step) {
    SetGrads(params, step, (*opt)->loss_scale());
    const int64_t reads = TestDeviceCopiesToHost();
    const int64_t writes = TestDeviceCopiesFromHost();
    auto info = (*opt)->Step(0.01);
    EXPECT_TRUE(info.ok()) << info.status();
    if (!info.ok()) return run;
    EXPECT_EQ(TestDeviceCopiesToHost() - reads, device.is_cpu() ? 0 : 1)
        << "step " << step << ": device-to-host copies";
    EXPECT_EQ(TestDeviceCopiesFromHost() - writes, 0) << "step " << step;
    EXPECT_EQ(info->skipped, step == 1) << "step " << step;
    char text[128];
    std::snprintf(text, sizeof(text), "%a %d %a %lld", info->grad_norm,
                  info->skipped, info->loss_scale,
                  static_cast<long long>(info->num_zeros));
    run.steps.push_back(text);
  }
  for (const auto& p : params) run.bytes.push_back(HostBytes(p->value));
  for (const StateTensor& s : (*opt)->StateTensors()) {
    EXPECT_EQ(s.tensor.device(), device) << s.name;
    run.bytes.push_back(HostBytes(s.tensor));
  }
  return run;
}

TEST(OptimizerDeviceTest, TestDeviceMatchesCpuBitForBit) {
  for (OptimizerType type : {OptimizerType::kAdam, OptimizerType::kSgd}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      SCOPED_TRACE(absl::StrCat(type == OptimizerType::kAdam ? "adam " : "sgd ",
                                DTypeName(dtype)));
      const TrainRun cpu = Train(type, dtype, Device::CPU());
      const TrainRun dev = Train(type, dtype, Device::TestDevice());
      EXPECT_EQ(cpu.steps, dev.steps);
      ASSERT_EQ(cpu.bytes.size(), dev.bytes.size());
      for (size_t i = 0; i < cpu.bytes.size(); ++i) {
        EXPECT_TRUE(cpu.bytes[i] == dev.bytes[i]) << "tensor " << i;
      }
    }
  }
}

// --use-precision-aware-optimizer: the lowered state widens, updates and
// rounds back through the device's kernels, with no extra host copies.
TEST(OptimizerDeviceTest, LowerPrecisionStateMatchesCpuBitForBit) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    StatePrecision precision;
    precision.exp_avg = DType::kBFloat16;
    precision.exp_avg_sq = DType::kFloat16;
    // Only 16-bit weights have a main copy of the optimizer's own.
    if (dtype != DType::kFloat32) precision.main_params = DType::kFloat16;
    SCOPED_TRACE(DTypeName(dtype));
    const TrainRun cpu =
        Train(OptimizerType::kAdam, dtype, Device::CPU(), precision);
    const TrainRun dev =
        Train(OptimizerType::kAdam, dtype, Device::TestDevice(), precision);
    EXPECT_EQ(cpu.steps, dev.steps);
    ASSERT_EQ(cpu.bytes.size(), dev.bytes.size());
    for (size_t i = 0; i < cpu.bytes.size(); ++i) {
      EXPECT_TRUE(cpu.bytes[i] == dev.bytes[i]) << "tensor " << i;
    }
  }
}

TEST(OptimizerDeviceTest, StatsReadOnceWithOtherValues) {
  // The trainer's form: the statistics land in part of a larger device
  // buffer, read once with whatever else it holds.
  ParameterList params = MakeParams(DType::kFloat32, Device::TestDevice());
  OptimizerConfig config;
  auto opt = Optimizer::Create(params, config, OptimizerGroups());
  ASSERT_TRUE(opt.ok()) << opt.status();
  SetGrads(params, 0, 1.0);
  Tensor buffer = Tensor::Zeros({6}, DType::kFloat32, Device::TestDevice());
  Tensor stats = *buffer.Slice(2, 6);
  const int64_t reads = TestDeviceCopiesToHost();
  ASSERT_TRUE((*opt)->ComputeGradStats(&stats).ok());
  EXPECT_EQ(TestDeviceCopiesToHost(), reads);
  const std::vector<float> host = buffer.To(Device::CPU())->ToFloats();
  auto info = (*opt)->ApplyStep(0.01, {host.data() + 2, 4});
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(TestDeviceCopiesToHost(), reads + 1);
  EXPECT_GT(info->grad_norm, 1.0);
  EXPECT_FALSE(info->skipped);
  // A stats tensor on the wrong device or of the wrong size is refused.
  Tensor wrong = Tensor::Zeros({4}, DType::kFloat32);
  EXPECT_FALSE((*opt)->ComputeGradStats(&wrong).ok());
  EXPECT_FALSE((*opt)->ApplyStep(0.01, {host.data(), 3}).ok());
}

TEST(OptimizerDeviceTest, RefusesParametersOnTwoDevices) {
  ParameterList params = MakeParams(DType::kFloat32, Device::TestDevice());
  ParameterList cpu = MakeParams(DType::kFloat32, Device::CPU());
  params.push_back(cpu[0]);
  auto opt = Optimizer::Create(params, OptimizerConfig(), OptimizerGroups());
  ASSERT_FALSE(opt.ok());
  EXPECT_NE(opt.status().message().find("one device"), std::string::npos)
      << opt.status();
}

}  // namespace
}  // namespace optim
}  // namespace mcc
