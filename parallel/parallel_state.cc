#include "parallel/parallel_state.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace mcc {
namespace parallel {
namespace {

// Every rank walks every group of a kind (NewSubgroup is collective over
// the world) and keeps the one it belongs to.
absl::StatusOr<std::shared_ptr<comm::ProcessGroup>> MakeGroups(
    comm::ProcessGroup* world, const std::vector<std::vector<int>>& groups) {
  std::shared_ptr<comm::ProcessGroup> mine;
  for (const auto& ranks : groups) {
    MCC_ASSIGN_OR_RETURN(auto group, world->NewSubgroup(ranks));
    if (group != nullptr) mine = std::move(group);
  }
  return mine;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParallelState>> ParallelState::Create(
    std::shared_ptr<comm::ProcessGroup> world, ParallelSizes sizes,
    std::shared_ptr<comm::ProcessGroup> device_world) {
  MCC_ASSIGN_OR_RETURN(RankLayout layout,
                       RankLayout::Create(world->size(), sizes));
  if (device_world != nullptr && (device_world->size() != world->size() ||
                                  device_world->rank() != world->rank())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ParallelState: the device world '", device_world->name(), "' (rank ",
        device_world->rank(), " of ", device_world->size(),
        ") is not the host world '", world->name(), "' (rank ", world->rank(),
        " of ", world->size(), ")"));
  }
  auto state = std::unique_ptr<ParallelState>(new ParallelState);
  state->layout_ = layout;
  state->coords_ = layout.Coordinates(world->rank());
  state->expert_coords_ = layout.ExpertCoordinatesOf(world->rank());
  const std::vector<std::vector<int>> kinds[kNumKinds] = {
      {},  // The world itself.
      layout.TensorGroups(),
      layout.PipelineGroups(),
      layout.ContextGroups(),
      layout.DataGroups(),
      layout.DataContextGroups(),
      layout.TensorContextGroups(),
      layout.ModelGroups(),
      layout.EmbeddingGroups(),
      layout.ExpertModelGroups(),
      layout.ExpertTensorGroups(),
      layout.ExpertTensorModelGroups(),
      layout.ExpertDataGroups(),
      // With one instance nobody asks for these: skip making them.
      sizes.distributed_optimizer_instances > 1
          ? layout.InstanceGroups()
          : std::vector<std::vector<int>>(),
      sizes.distributed_optimizer_instances > 1
          ? layout.CrossInstanceGroups()
          : std::vector<std::vector<int>>(),
      sizes.distributed_optimizer_instances > 1
          ? layout.ExpertInstanceGroups()
          : std::vector<std::vector<int>>(),
      sizes.distributed_optimizer_instances > 1
          ? layout.ExpertCrossInstanceGroups()
          : std::vector<std::vector<int>>(),
  };
  const bool twins = device_world != nullptr && device_world != world;
  state->groups_[kWorld] = {world, twins ? device_world : world};
  for (int k = kWorld + 1; k < kNumKinds; ++k) {
    Twins& g = state->groups_[k];
    // An expert group over a dense group's ranks is that group (no new
    // subgroup: every rank decides alike from the layout alone).
    bool shared = false;
    // The experts' instances likewise share the dense instances' groups
    // where they coincide (EP 1, ETP = TP).
    const int last_shareable =
        k >= kExpertInstance ? kCrossInstance : kExpertModel - 1;
    for (int j = kTensor; k >= kExpertModel && j <= last_shareable; ++j) {
      if (j != kEmbedding && kinds[j] == kinds[k]) {
        g = state->groups_[j];
        shared = true;
        break;
      }
    }
    if (shared) continue;
    MCC_ASSIGN_OR_RETURN(g.host, MakeGroups(world.get(), kinds[k]));
    g.device = g.host;
    if (twins) {
      MCC_ASSIGN_OR_RETURN(g.device, MakeGroups(device_world.get(), kinds[k]));
    }
  }
  if (!state->is_first_stage() && !state->is_last_stage()) {
    state->groups_[kEmbedding] = Twins();
  }
  return state;
}

comm::ProcessGroup* ParallelState::GroupFor(const comm::ProcessGroup* group,
                                            Device device) const {
  if (group == nullptr) return nullptr;
  for (const Twins& g : groups_) {
    if (g.host.get() != group && g.device.get() != group) continue;
    if (g.host->device() == device) return g.host.get();
    if (g.device->device() == device) return g.device.get();
    break;
  }
  return const_cast<comm::ProcessGroup*>(group);
}

std::string ParallelState::ToString() const {
  const comm::ProcessGroup* world = groups_[kWorld].host.get();
  std::string out = absl::StrCat(layout_.ToString(), "; rank ", world->rank(),
                                 " is tp ", coords_.tp, ", cp ", coords_.cp,
                                 ", dp ", coords_.dp, ", pp ", coords_.pp);
  if (groups_[kWorld].device != groups_[kWorld].host) {
    absl::StrAppend(&out, "; ", groups_[kWorld].device->backend(),
                    " groups move ",
                    groups_[kWorld].device->device().ToString(), " tensors, ",
                    groups_[kWorld].host->backend(), " groups host tensors");
  }
  return out;
}

}  // namespace parallel
}  // namespace mcc
