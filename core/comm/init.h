#ifndef CORE_COMM_INIT_H_
#define CORE_COMM_INIT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "core/comm/env.h"
#include "core/comm/process_group.h"
#include "core/comm/tcp_store.h"

namespace mcc {
namespace comm {

// The world of one job: where this process sits, the rendezvous store
// (hosted by rank 0) and the gloo group of every rank (named "world").
struct World {
  DistEnv env;
  std::shared_ptr<TcpStore> store;
  std::shared_ptr<ProcessGroup> group;
};

// Connects to (rank 0: hosts) the store at env.master_addr:master_port and
// creates the world gloo group. options.timeout bounds the rendezvous too.
absl::StatusOr<World> InitWorld(const DistEnv& env,
                                GroupOptions options = GroupOptions());
// The same with the environment read by DistEnvFromEnvironment().
absl::StatusOr<World> InitWorldFromEnvironment(
    GroupOptions options = GroupOptions());

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_INIT_H_
