#include "parallel/rank_layout.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mcc {
namespace parallel {

absl::StatusOr<RankLayout> RankLayout::Create(int world_size,
                                              ParallelSizes sizes) {
  if (world_size <= 0 || sizes.tensor <= 0 || sizes.pipeline <= 0 ||
      sizes.context <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parallel sizes must be positive: world size ", world_size,
                     ", tensor-model-parallel-size ", sizes.tensor,
                     ", pipeline-model-parallel-size ", sizes.pipeline,
                     ", context-parallel-size ", sizes.context));
  }
  const int model = sizes.tensor * sizes.pipeline * sizes.context;
  if (world_size % model != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "world size ", world_size,
        " is not divisible by tensor-model-parallel-size (", sizes.tensor,
        ") x pipeline-model-parallel-size (", sizes.pipeline,
        ") x context-parallel-size (", sizes.context, ") = ", model));
  }
  RankLayout layout;
  layout.world_size_ = world_size;
  layout.tp_ = sizes.tensor;
  layout.pp_ = sizes.pipeline;
  layout.cp_ = sizes.context;
  layout.dp_ = world_size / model;
  return layout;
}

RankCoordinates RankLayout::Coordinates(int rank) const {
  CHECK(rank >= 0 && rank < world_size_)
      << "rank " << rank << " outside " << ToString();
  RankCoordinates c;
  c.tp = rank % tp_;
  rank /= tp_;
  c.cp = rank % cp_;
  rank /= cp_;
  c.dp = rank % dp_;
  c.pp = rank / dp_;
  return c;
}

int RankLayout::RankOf(const RankCoordinates& c) const {
  return c.tp + tp_ * (c.cp + cp_ * (c.dp + dp_ * c.pp));
}

std::vector<std::vector<int>> RankLayout::Groups(bool tp, bool cp, bool dp,
                                                 bool pp) const {
  const int sizes[4] = {tp_, cp_, dp_, pp_};
  const bool vary[4] = {tp, cp, dp, pp};
  // Enumerate the fixed dimensions in the outer loop (innermost fastest) and
  // the varying ones inside, both in tp, cp, dp, pp order.
  int fixed_count = 1;
  int group_size = 1;
  for (int d = 0; d < 4; ++d) (vary[d] ? group_size : fixed_count) *= sizes[d];
  std::vector<std::vector<int>> groups;
  groups.reserve(fixed_count);
  for (int f = 0; f < fixed_count; ++f) {
    int coord[4];
    int rem = f;
    for (int d = 0; d < 4; ++d) {
      if (!vary[d]) {
        coord[d] = rem % sizes[d];
        rem /= sizes[d];
      }
    }
    std::vector<int> group;
    group.reserve(group_size);
    for (int g = 0; g < group_size; ++g) {
      int r = g;
      for (int d = 0; d < 4; ++d) {
        if (vary[d]) {
          coord[d] = r % sizes[d];
          r /= sizes[d];
        }
      }
      group.push_back(RankOf({coord[0], coord[1], coord[2], coord[3]}));
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

std::vector<std::vector<int>> RankLayout::TensorGroups() const {
  return Groups(true, false, false, false);
}
std::vector<std::vector<int>> RankLayout::PipelineGroups() const {
  return Groups(false, false, false, true);
}
std::vector<std::vector<int>> RankLayout::ContextGroups() const {
  return Groups(false, true, false, false);
}
std::vector<std::vector<int>> RankLayout::DataGroups() const {
  return Groups(false, false, true, false);
}
std::vector<std::vector<int>> RankLayout::DataContextGroups() const {
  return Groups(false, true, true, false);
}
std::vector<std::vector<int>> RankLayout::TensorContextGroups() const {
  return Groups(true, true, false, false);
}
std::vector<std::vector<int>> RankLayout::ModelGroups() const {
  return Groups(true, false, false, true);
}

std::vector<std::vector<int>> RankLayout::EmbeddingGroups() const {
  std::vector<std::vector<int>> groups;
  for (const auto& pipeline : PipelineGroups()) {
    if (pipeline.size() == 1) {
      groups.push_back(pipeline);
    } else {
      groups.push_back({pipeline.front(), pipeline.back()});
    }
  }
  return groups;
}

std::vector<int> RankLayout::GroupOf(
    const std::vector<std::vector<int>>& groups, int rank) {
  for (const auto& g : groups) {
    for (int r : g) {
      if (r == rank) return g;
    }
  }
  return {};
}

std::string RankLayout::ToString() const {
  return absl::StrCat("world ", world_size_, " = TP ", tp_, " x CP ", cp_,
                      " x DP ", dp_, " x PP ", pp_);
}

}  // namespace parallel
}  // namespace mcc
