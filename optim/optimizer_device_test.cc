// The optimizer with its parameters, gradients, fp32 main weights and state
// on the test device (a device that is not the host,
// core/testing/test_device.h): AdamW and SGD on fp32, bf16 and fp16
// parameters with dynamic loss scaling (an overflow step skipped), clipping
// and zero counting must give the CPU run's parameters, state and step
// reports bit for bit, with exactly one device-to-host copy per Step (the
// gradient statistics) and none in ComputeGradStats / ApplyStep.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/testing/test_device.h"
#include "gtest/gtest.h"
#include "optim/offload_split.h"
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
  std::vector<double> params_norms;         // ParamsNorm after each step.
};

// ParamsNorm sums the host's and the device's shares separately when
// offloading: the same float64 sum carried as two fp32 halves (about 48
// bits), so equal to a relative 2^-40 rather than bit for bit.
void ExpectNormsClose(const TrainRun& a, const TrainRun& b) {
  ASSERT_EQ(a.params_norms.size(), b.params_norms.size());
  for (size_t i = 0; i < a.params_norms.size(); ++i) {
    EXPECT_NEAR(a.params_norms[i], b.params_norms[i],
                std::ldexp(a.params_norms[i], -40))
        << "step " << i;
  }
}

// offload: --optimizer-offload-fraction (0: none).
TrainRun Train(OptimizerType type, DType dtype, Device device,
               StatePrecision precision = StatePrecision(),
               double offload = 0.0) {
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
  config.cpu_offload_fraction = offload;
  auto opt = Optimizer::Create(params, config, OptimizerGroups());
  EXPECT_TRUE(opt.ok()) << opt.status();
  if (!opt.ok()) return run;
  EXPECT_EQ((*opt)->device(), device);
  // Each offloaded piece costs one copy each way per applied step.
  std::vector<int64_t> sizes;
  for (const auto& p : params) sizes.push_back(p->value.numel());
  const std::vector<bool> offloaded = *SplitForOffload(sizes, offload);
  const int64_t num_offloaded =
      std::count(offloaded.begin(), offloaded.end(), true);
  for (int step = 0; step < 4; ++step) {
    SetGrads(params, step, (*opt)->loss_scale());
    const int64_t reads = TestDeviceCopiesToHost();
    const int64_t writes = TestDeviceCopiesFromHost();
    auto info = (*opt)->Step(0.01);
    EXPECT_TRUE(info.ok()) << info.status();
    if (!info.ok()) return run;
    const int64_t moved = info->skipped ? 0 : num_offloaded;
    EXPECT_EQ(TestDeviceCopiesToHost() - reads,
              (device.is_cpu() ? 0 : 1) + moved)
        << "step " << step << ": device-to-host copies";
    EXPECT_EQ(TestDeviceCopiesFromHost() - writes, moved) << "step " << step;
    EXPECT_EQ(info->skipped, step == 1) << "step " << step;
    auto norm = (*opt)->ParamsNorm();
    EXPECT_TRUE(norm.ok()) << norm.status();
    run.params_norms.push_back(norm.ok() ? *norm : -1.0);
    char text[128];
    std::snprintf(text, sizeof(text), "%a %d %a %lld", info->grad_norm,
                  info->skipped, info->loss_scale,
                  static_cast<long long>(info->num_zeros));
    run.steps.push_back(text);
  }
  for (const auto& p : params) run.bytes.push_back(HostBytes(p->value));
  for (const StateTensor& s : (*opt)->StateTensors()) {
    const size_t index = s.param_name[1] - '0';  // "p<i>"
    EXPECT_EQ(s.tensor.device(), offloaded[index] ? Device::CPU() : device)
        << s.name;
    run.bytes.push_back(HostBytes(s.tensor));
  }
  EXPECT_EQ((*opt)->offloaded_state_bytes() > 0, num_offloaded > 0);
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

// --optimizer-cpu-offload: the offloaded pieces' main weights and state live
// on the host and are stepped by the CPU kernels, the rest on the device;
// the result equals the all-CPU run bit for bit (the test device runs the
// CPU kernels), with each offloaded piece's gradient and weights crossing
// once per applied step. Fractions: one piece of three, all of them.
TEST(OptimizerDeviceTest, OffloadedShareMatchesCpuBitForBit) {
  for (double fraction : {0.1, 1.0}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
      for (bool lowered : {false, true}) {
        SCOPED_TRACE(absl::StrCat("fraction ", fraction, " ", DTypeName(dtype),
                                  lowered ? " bf16 moments" : ""));
        StatePrecision precision;
        if (lowered) precision.exp_avg = DType::kBFloat16;
        const TrainRun cpu =
            Train(OptimizerType::kAdam, dtype, Device::CPU(), precision);
        const TrainRun dev = Train(OptimizerType::kAdam, dtype,
                                   Device::TestDevice(), precision, fraction);
        EXPECT_EQ(cpu.steps, dev.steps);
        ExpectNormsClose(cpu, dev);
        ASSERT_EQ(cpu.bytes.size(), dev.bytes.size());
        for (size_t i = 0; i < cpu.bytes.size(); ++i) {
          EXPECT_TRUE(cpu.bytes[i] == dev.bytes[i]) << "tensor " << i;
        }
      }
    }
  }
  const TrainRun cpu =
      Train(OptimizerType::kSgd, DType::kBFloat16, Device::CPU());
  const TrainRun dev = Train(OptimizerType::kSgd, DType::kBFloat16,
                             Device::TestDevice(), StatePrecision(), 0.5);
  EXPECT_EQ(cpu.steps, dev.steps);
  ExpectNormsClose(cpu, dev);
  EXPECT_EQ(cpu.bytes, dev.bytes);
}

TEST(OptimizerDeviceTest, OffloadRefusedOnTheCpuDevice) {
  ParameterList params = MakeParams(DType::kFloat32, Device::CPU());
  OptimizerConfig config;
  config.cpu_offload_fraction = 0.5;
  auto opt = Optimizer::Create(params, config, OptimizerGroups());
  ASSERT_FALSE(opt.ok());
  EXPECT_NE(opt.status().message().find("meaningless"), std::string::npos)
      << opt.status();
  config.cpu_offload_fraction = 1.5;
  params = MakeParams(DType::kFloat32, Device::TestDevice());
  opt = Optimizer::Create(params, config, OptimizerGroups());
  ASSERT_FALSE(opt.ok());
  EXPECT_NE(opt.status().message().find("--optimizer-offload-fraction"),
            std::string::npos)
      << opt.status();
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
