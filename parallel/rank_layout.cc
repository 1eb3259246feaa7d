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
  const int etp = sizes.expert_tensor == 0 ? sizes.tensor : sizes.expert_tensor;
  if (sizes.expert_model <= 0 || etp <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert parallel sizes must be positive: expert-model-parallel-size ",
        sizes.expert_model, ", expert-tensor-parallel-size ",
        sizes.expert_tensor));
  }
  const int expert_model = etp * sizes.expert_model * sizes.pipeline;
  if (world_size % expert_model != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", world_size,
                     " is not divisible by expert-tensor-parallel-size (", etp,
                     ") x expert-model-parallel-size (", sizes.expert_model,
                     ") x pipeline-model-parallel-size (", sizes.pipeline,
                     ") = ", expert_model));
  }
  const int instances = sizes.distributed_optimizer_instances;
  const int dp_cp = world_size / model * sizes.context;
  if (instances <= 0 || dp_cp % instances != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-distributed-optimizer-instances ", instances,
        " must be positive and divide data-parallel size (", world_size / model,
        ") x context-parallel-size (", sizes.context, ") = ", dp_cp));
  }
  const int edp = world_size / expert_model;
  if (instances > 1 && edp % instances != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num-distributed-optimizer-instances ", instances,
        " must divide the expert-data-parallel size ", edp,
        " (world size / (expert-tensor-parallel-size ", etp,
        " x expert-model-parallel-size ", sizes.expert_model,
        " x pipeline-model-parallel-size ", sizes.pipeline,
        ")): the experts' optimizer state splits into as many instances"));
  }
  RankLayout layout;
  layout.instances_ = instances;
  layout.world_size_ = world_size;
  layout.tp_ = sizes.tensor;
  layout.pp_ = sizes.pipeline;
  layout.cp_ = sizes.context;
  layout.dp_ = world_size / model;
  layout.etp_ = etp;
  layout.ep_ = sizes.expert_model;
  layout.edp_ = edp;
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

namespace {

// Groups over a mixed-radix layout rank = c0 + s0 * (c1 + s1 * (c2 + s2 *
// c3)) that vary the dimensions where vary[d] is true, one group per setting
// of the others: the fixed dimensions enumerate groups and the varying ones
// enumerate members, innermost fastest in both (Megatron's order).
std::vector<std::vector<int>> OrthogonalGroups(const int sizes[4],
                                               const bool vary[4]) {
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
      group.push_back(
          coord[0] +
          sizes[0] * (coord[1] + sizes[1] * (coord[2] + sizes[2] * coord[3])));
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace

std::vector<std::vector<int>> RankLayout::Groups(bool tp, bool cp, bool dp,
                                                 bool pp) const {
  const int sizes[4] = {tp_, cp_, dp_, pp_};
  const bool vary[4] = {tp, cp, dp, pp};
  return OrthogonalGroups(sizes, vary);
}

std::vector<std::vector<int>> RankLayout::ExpertGroups(bool etp, bool ep,
                                                       bool edp,
                                                       bool pp) const {
  const int sizes[4] = {etp_, ep_, edp_, pp_};
  const bool vary[4] = {etp, ep, edp, pp};
  return OrthogonalGroups(sizes, vary);
}

ExpertCoordinates RankLayout::ExpertCoordinatesOf(int rank) const {
  CHECK(rank >= 0 && rank < world_size_)
      << "rank " << rank << " outside " << ToString();
  ExpertCoordinates c;
  c.etp = rank % etp_;
  rank /= etp_;
  c.ep = rank % ep_;
  rank /= ep_;
  c.edp = rank % edp_;
  c.pp = rank / edp_;
  return c;
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

std::vector<std::vector<int>> RankLayout::InstanceGroups() const {
  std::vector<std::vector<int>> groups;
  for (const auto& g : DataContextGroups()) {
    const size_t per = g.size() / instances_;
    for (int i = 0; i < instances_; ++i) {
      groups.emplace_back(g.begin() + i * per, g.begin() + (i + 1) * per);
    }
  }
  return groups;
}

std::vector<std::vector<int>> RankLayout::CrossInstanceGroups() const {
  std::vector<std::vector<int>> groups;
  for (const auto& g : DataContextGroups()) {
    const size_t per = g.size() / instances_;
    for (size_t j = 0; j < per; ++j) {
      std::vector<int> across;
      for (int i = 0; i < instances_; ++i) across.push_back(g[i * per + j]);
      groups.push_back(std::move(across));
    }
  }
  return groups;
}

namespace {

// Each group cut into `n` contiguous runs (across: false), or the ranks at
// the same place in every run (across: true).
std::vector<std::vector<int>> SplitIntoInstances(
    const std::vector<std::vector<int>>& groups, int n, bool across) {
  std::vector<std::vector<int>> out;
  for (const auto& g : groups) {
    const size_t per = g.size() / n;
    if (!across) {
      for (int i = 0; i < n; ++i) {
        out.emplace_back(g.begin() + i * per, g.begin() + (i + 1) * per);
      }
      continue;
    }
    for (size_t j = 0; j < per; ++j) {
      std::vector<int> ranks;
      for (int i = 0; i < n; ++i) ranks.push_back(g[i * per + j]);
      out.push_back(std::move(ranks));
    }
  }
  return out;
}

}  // namespace

std::vector<std::vector<int>> RankLayout::ExpertInstanceGroups() const {
  return SplitIntoInstances(ExpertDataGroups(), instances_, false);
}

std::vector<std::vector<int>> RankLayout::ExpertCrossInstanceGroups() const {
  return SplitIntoInstances(ExpertDataGroups(), instances_, true);
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

std::vector<std::vector<int>> RankLayout::ExpertModelGroups() const {
  return ExpertGroups(false, true, false, false);
}
std::vector<std::vector<int>> RankLayout::ExpertTensorGroups() const {
  return ExpertGroups(true, false, false, false);
}
std::vector<std::vector<int>> RankLayout::ExpertTensorModelGroups() const {
  return ExpertGroups(true, true, false, false);
}
std::vector<std::vector<int>> RankLayout::ExpertDataGroups() const {
  return ExpertGroups(false, false, true, false);
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
  std::string out = absl::StrCat("world ", world_size_, " = TP ", tp_, " x CP ",
                                 cp_, " x DP ", dp_, " x PP ", pp_);
  if (ep_ > 1 || etp_ != tp_) {
    absl::StrAppend(&out, "; experts ETP ", etp_, " x EP ", ep_, " x EDP ",
                    edp_, " x PP ", pp_);
  }
  if (instances_ > 1) {
    absl::StrAppend(&out, " (", instances_,
                    " distributed optimizer instances)");
  }
  return out;
}

}  // namespace parallel
}  // namespace mcc
