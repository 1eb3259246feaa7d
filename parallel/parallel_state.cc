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
    std::shared_ptr<comm::ProcessGroup> world, ParallelSizes sizes) {
  MCC_ASSIGN_OR_RETURN(RankLayout layout,
                       RankLayout::Create(world->size(), sizes));
  auto state = std::unique_ptr<ParallelState>(new ParallelState);
  state->layout_ = layout;
  state->coords_ = layout.Coordinates(world->rank());
  state->world_ = world;
  comm::ProcessGroup* w = world.get();
  MCC_ASSIGN_OR_RETURN(state->tp_, MakeGroups(w, layout.TensorGroups()));
  MCC_ASSIGN_OR_RETURN(state->pp_, MakeGroups(w, layout.PipelineGroups()));
  MCC_ASSIGN_OR_RETURN(state->cp_, MakeGroups(w, layout.ContextGroups()));
  MCC_ASSIGN_OR_RETURN(state->dp_, MakeGroups(w, layout.DataGroups()));
  MCC_ASSIGN_OR_RETURN(state->dp_cp_,
                       MakeGroups(w, layout.DataContextGroups()));
  MCC_ASSIGN_OR_RETURN(state->tp_cp_,
                       MakeGroups(w, layout.TensorContextGroups()));
  MCC_ASSIGN_OR_RETURN(state->mp_, MakeGroups(w, layout.ModelGroups()));
  MCC_ASSIGN_OR_RETURN(state->embedding_,
                       MakeGroups(w, layout.EmbeddingGroups()));
  if (!state->is_first_stage() && !state->is_last_stage()) {
    state->embedding_.reset();
  }
  return state;
}

std::string ParallelState::ToString() const {
  return absl::StrCat(layout_.ToString(), "; rank ", world_->rank(), " is tp ",
                      coords_.tp, ", cp ", coords_.cp, ", dp ", coords_.dp,
                      ", pp ", coords_.pp);
}

}  // namespace parallel
}  // namespace mcc
