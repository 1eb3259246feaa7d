#include "core/comm/init.h"

#include <algorithm>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/comm/gloo_process_group.h"
#include "core/status_macros.h"

namespace mcc {
namespace comm {
namespace {

struct FactoryRegistry {
  std::mutex mu;
  DeviceWorldFactory factory[kNumDeviceTypes] = {};
};

FactoryRegistry& Registry() {
  static FactoryRegistry* registry = new FactoryRegistry;
  return *registry;
}

DeviceWorldFactory FactoryFor(DeviceType type) {
  FactoryRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.factory[static_cast<int>(type)];
}

// The second world group, for `device`'s tensors.
absl::StatusOr<std::shared_ptr<ProcessGroup>> CreateDeviceWorld(
    const World& world, const GroupOptions& options, Device device,
    std::vector<int> ranks) {
  const DistEnv& env = world.env;
  if (IsHostBacked(device.type)) {
    // gloo moves a host-backed device's tensors through their host views.
    GroupOptions device_options = options;
    device_options.device = device;
    const std::string name = absl::StrCat("world.", device.ToString());
    return CreateGlooProcessGroup(
        std::make_shared<PrefixStore>(name, world.store), env.rank,
        env.world_size, name, std::move(ranks), std::move(device_options));
  }
  DeviceWorldFactory factory = FactoryFor(device.type);
  if (factory == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", env.rank, ": no process group moves tensors on ",
        device.ToString(),
        device.is_cuda() ? " (link //core/comm:nccl_world for NCCL)" : ""));
  }
  const std::string name = device.is_cuda() ? "world.nccl" : "world.device";
  return factory(std::make_shared<PrefixStore>(name, world.store), env, name,
                 options, device);
}

}  // namespace

ProcessGroup* World::For(Device device) const {
  if (device_group != nullptr && device_group->device() == device) {
    return device_group.get();
  }
  return group.get();
}

void RegisterDeviceWorldFactory(DeviceType type, DeviceWorldFactory factory) {
  FactoryRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factory[static_cast<int>(type)] = factory;
}

absl::StatusOr<World> InitWorld(const DistEnv& env, GroupOptions options,
                                Device device) {
  World world;
  world.env = env;
  TcpStore::Options store_options;
  store_options.host = env.master_addr;
  store_options.port = env.master_port;
  store_options.is_server = env.rank == 0;
  store_options.rank = env.rank;
  store_options.job_id = env.job_id;
  store_options.secret = env.secret;
  // Each rank holds two connections (the store and its liveness clone);
  // room for those and a few more of each rank's own.
  store_options.limits.max_connections =
      std::max(store_options.limits.max_connections, 4 * env.world_size + 64);
  store_options.timeout = options.timeout;
  MCC_ASSIGN_OR_RETURN(world.store, TcpStore::Connect(store_options));
  if (options.liveness_store == nullptr) {
    MCC_ASSIGN_OR_RETURN(options.liveness_store, world.store->Clone());
  }
  std::vector<int> ranks(env.world_size);
  std::iota(ranks.begin(), ranks.end(), 0);
  MCC_ASSIGN_OR_RETURN(world.group,
                       CreateGlooProcessGroup(
                           std::make_shared<PrefixStore>("world", world.store),
                           env.rank, env.world_size, "world", ranks, options));
  // The CPU (the default) asks for no device world: callers that set
  // options.device (the test device's parity tests) get their gloo group
  // for both.
  if (device == world.group->device() || device.is_cpu()) {
    world.device_group = world.group;
  } else {
    MCC_ASSIGN_OR_RETURN(world.device_group,
                         CreateDeviceWorld(world, options, device, ranks));
  }
  return world;
}

absl::StatusOr<World> InitWorldFromEnvironment(GroupOptions options,
                                               Device device) {
  MCC_ASSIGN_OR_RETURN(DistEnv env, DistEnvFromEnvironment());
  return InitWorld(env, std::move(options), device);
}

}  // namespace comm
}  // namespace mcc
