#include "core/comm/init.h"

#include <numeric>
#include <vector>

#include "core/comm/gloo_process_group.h"
#include "core/status_macros.h"

namespace mcc {
namespace comm {

absl::StatusOr<World> InitWorld(const DistEnv& env, GroupOptions options) {
  World world;
  world.env = env;
  TcpStore::Options store_options;
  store_options.host = env.master_addr;
  store_options.port = env.master_port;
  store_options.is_server = env.rank == 0;
  store_options.rank = env.rank;
  store_options.timeout = options.timeout;
  MCC_ASSIGN_OR_RETURN(world.store, TcpStore::Connect(store_options));
  if (options.liveness_store == nullptr) {
    MCC_ASSIGN_OR_RETURN(options.liveness_store, world.store->Clone());
  }
  std::vector<int> ranks(env.world_size);
  std::iota(ranks.begin(), ranks.end(), 0);
  MCC_ASSIGN_OR_RETURN(
      std::shared_ptr<GlooProcessGroup> group,
      GlooProcessGroup::Create(
          std::make_shared<PrefixStore>("world", world.store), env.rank,
          env.world_size, "world", std::move(ranks), std::move(options)));
  world.group = std::move(group);
  return world;
}

absl::StatusOr<World> InitWorldFromEnvironment(GroupOptions options) {
  MCC_ASSIGN_OR_RETURN(DistEnv env, DistEnvFromEnvironment());
  return InitWorld(env, std::move(options));
}

}  // namespace comm
}  // namespace mcc
