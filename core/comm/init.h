#ifndef CORE_COMM_INIT_H_
#define CORE_COMM_INIT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/comm/env.h"
#include "core/comm/process_group.h"
#include "core/comm/tcp_store.h"

namespace mcc {
namespace comm {

// The world of one job: where this process sits, the rendezvous store
// (hosted by rank 0), the gloo group of every rank (named "world") and, for
// a device that is not the host, a second group of every rank that moves
// that device's tensors (NCCL for CUDA). Host scalars, barriers and the
// store stay on gloo; parameters, gradients and activations travel on the
// device group.
struct World {
  DistEnv env;
  std::shared_ptr<TcpStore> store;
  std::shared_ptr<ProcessGroup> group;
  // Moves tensors on the job's device: `group` itself when that device is
  // the one gloo moves (the CPU), else "world.<backend>".
  std::shared_ptr<ProcessGroup> device_group;

  // The world group that moves tensors on `device`: the one place where a
  // tensor's device picks its backend. An unknown device gets `group`,
  // whose collectives then refuse the tensor naming both devices.
  ProcessGroup* For(Device device) const;
};

// Makes the device world for a device type that gloo cannot move (CUDA):
// `store` is already prefixed for the group, `device` says which GPU.
// Registered by the backend's library when it is linked
// (//core/comm:nccl_world registers NCCL for CUDA).
using DeviceWorldFactory = absl::StatusOr<std::shared_ptr<ProcessGroup>> (*)(
    std::shared_ptr<Store> store, const DistEnv& env, std::string name,
    GroupOptions options, Device device);
void RegisterDeviceWorldFactory(DeviceType type, DeviceWorldFactory factory);

// Connects to (rank 0: hosts) the store at env.master_addr:master_port and
// creates the world gloo group (moving options.device's tensors, the CPU by
// default). options.timeout bounds the rendezvous too. With `device` other
// than the CPU and the gloo group's, also creates the device world: gloo again
// on a host-backed device (the test device), the registered factory's group
// otherwise (NCCL for CUDA); an error names the device when no backend can
// move its tensors.
absl::StatusOr<World> InitWorld(const DistEnv& env,
                                GroupOptions options = GroupOptions(),
                                Device device = Device::CPU());
// The same with the environment read by DistEnvFromEnvironment().
absl::StatusOr<World> InitWorldFromEnvironment(
    GroupOptions options = GroupOptions(), Device device = Device::CPU());

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_INIT_H_
