// Linking //core/comm:nccl_world lets comm::InitWorld create the world
// group for CUDA tensors: an NCCL group on the job's GPU, beside gloo's.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/comm/init.h"
#include "core/comm/nccl_process_group.h"
#include "core/status_macros.h"

namespace mcc {
namespace comm {
namespace {

absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateNcclWorld(
    std::shared_ptr<Store> store, const DistEnv& env, std::string name,
    GroupOptions options, Device device) {
  std::vector<int> ranks(env.world_size);
  for (int r = 0; r < env.world_size; ++r) ranks[r] = r;
  return CreateNcclProcessGroup(std::move(store), env.rank, env.world_size,
                                std::move(name), std::move(ranks),
                                std::move(options), device.index);
}

const bool registered = [] {
  RegisterDeviceWorldFactory(DeviceType::kCUDA, &CreateNcclWorld);
  return true;
}();

}  // namespace
}  // namespace comm
}  // namespace mcc
