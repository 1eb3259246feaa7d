#include "training/device_choice.h"

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "core/comm/env.h"
#include "core/cuda/runtime.h"
#include "core/tensor.h"

namespace mcc {
namespace training {
namespace {

// Only a build that links //core/testing:test_device knows the test device.
bool TestDeviceLinked() { return IsHostBacked(DeviceType::kTestDevice); }

std::string Accepted() {
  return TestDeviceLinked() ? "cpu, cuda, auto or test" : "cpu, cuda or auto";
}

std::string Devices(int n) {
  return absl::StrCat(n, n == 1 ? " CUDA device" : " CUDA devices");
}

}  // namespace

absl::Status CheckDevice(const std::string& value) {
  if (value == "cpu" || value == "auto" ||
      (value == "test" && TestDeviceLinked())) {
    return absl::OkStatus();
  }
  if (value != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("--device: '", value, "' is not one of ", Accepted()));
  }
  if (cuda::CudaDeviceCount() == 0) {
    return absl::FailedPreconditionError(
        "--device cuda: no CUDA device is present (no driver, or none "
        "visible: check CUDA_VISIBLE_DEVICES); use --device cpu or auto");
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& value) {
  const absl::Status checked = CheckDevice(value);
  if (!checked.ok()) return checked;
  DeviceChoice choice;
  if (value == "cpu") {
    choice.device = Device::CPU();
    choice.reason = "--device cpu";
    return choice;
  }
  if (value == "test") {
    choice.device = Device::TestDevice();
    choice.reason =
        "--device test: the test device (CPU kernels behind a device's "
        "wall; test-only build)";
    return choice;
  }
  const int count = cuda::CudaDeviceCount();
  if (count == 0) {  // auto without a GPU.
    choice.device = Device::CPU();
    choice.reason = "--device auto: no CUDA device present";
    return choice;
  }
  auto env = comm::DistEnvFromEnvironment();
  const int local_rank = env.ok() ? env->local_rank : 0;
  const int local_world = env.ok() ? env->local_world_size : 1;
  choice.device = Device::CUDA(local_rank % count);
  absl::StatusOr<std::string> name =
      cuda::DeviceDescription(choice.device.index);
  choice.reason = absl::StrCat(
      "--device ", value, ": ", Devices(count), " present; LOCAL_RANK ",
      local_rank, " picks ", choice.device.ToString(), " (",
      name.ok() ? *name : std::string(name.status().message()), ")");
  if (local_world > count) {
    // NCCL refuses two ranks on one GPU ("duplicate GPU"): say why first.
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", value, ": ", local_world,
                     " processes on this node but ", Devices(count),
                     "; NCCL needs one GPU per process (tools/launch "
                     "--nproc_per_node ",
                     count, ", or --device cpu)"));
  }
  // The process's current device from now on (as torch.cuda.set_device):
  // kernels guard their tensors' device and restore the previous one, which
  // would otherwise be cuda:0 and give every rank a context there.
  const cudaError_t set = cudaSetDevice(choice.device.index);
  if (set != cudaSuccess) {
    return absl::InternalError(absl::StrCat(
        "--device ", value, ": cannot make ", choice.device.ToString(),
        " current: ", cudaGetErrorString(set)));
  }
  return choice;
}

}  // namespace training
}  // namespace mcc
