#include "checkpoint/save_plan.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "checkpoint/region.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace mcc {
namespace {

struct TensorInfo {
  std::vector<int64_t> global_shape;
  int dtype = 0;
  int first_rank = 0;
  // Distinct boxes by offsets+shape, with their holders.
  std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>,
           std::vector<int>>
      boxes;
};

std::vector<int64_t> ToVec(const google::protobuf::RepeatedField<int64_t>& f) {
  return std::vector<int64_t>(f.begin(), f.end());
}

}  // namespace

absl::StatusOr<std::vector<PlannedShard>> PlanSave(
    const std::vector<checkpoint::RankManifest>& manifests,
    bool require_cover) {
  std::map<std::string, TensorInfo> tensors;
  for (size_t r = 0; r < manifests.size(); ++r) {
    const int rank = static_cast<int>(r);
    for (const auto& t : manifests[r].tensors()) {
      const std::vector<int64_t> gshape = ToVec(t.global_shape());
      auto [it, inserted] = tensors.try_emplace(t.name());
      TensorInfo& info = it->second;
      if (inserted) {
        info.global_shape = gshape;
        info.dtype = t.dtype();
        info.first_rank = rank;
      } else if (info.global_shape != gshape || info.dtype != t.dtype()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", t.name(), ": rank ", info.first_rank, " saves ",
            DTypeName(static_cast<DType>(info.dtype)),
            ShapeToString(info.global_shape), " but rank ", rank, " saves ",
            DTypeName(static_cast<DType>(t.dtype())), ShapeToString(gshape)));
      }
      for (const auto& s : t.shards()) {
        auto& holders =
            info.boxes[{ToVec(s.global_offsets()), ToVec(s.local_shape())}];
        if (holders.empty() || holders.back() != rank) holders.push_back(rank);
      }
    }
  }

  std::vector<PlannedShard> plan;
  for (const auto& [name, info] : tensors) {
    std::vector<Box> boxes;
    std::vector<int> first_holder;
    int64_t covered = 0;
    for (const auto& [key, holders] : info.boxes) {
      Box b{key.first, key.second};
      for (size_t i = 0; i < boxes.size(); ++i) {
        const Box x = Intersect(boxes[i], b);
        if (!x.Empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "tensor ", name, ": shard ", boxes[i].ToString(), " of rank ",
              first_holder[i], " and shard ", b.ToString(), " of rank ",
              holders[0], " overlap in ", x.ToString(),
              " but are not the same shard"));
        }
      }
      boxes.push_back(b);
      first_holder.push_back(holders[0]);
      covered += b.NumElements();
      PlannedShard p;
      p.name = name;
      p.offsets = key.first;
      p.shape = key.second;
      p.bytes = b.NumElements() *
                static_cast<int64_t>(DTypeSize(static_cast<DType>(info.dtype)));
      p.holders = holders;
      plan.push_back(std::move(p));
    }
    const int64_t numel = NumElements(info.global_shape);
    if (require_cover && covered != numel) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", name, " ", ShapeToString(info.global_shape),
          ": the ranks' shards cover ", covered, " of ", numel, " elements"));
    }
  }

  // Largest first, each to its least-loaded holder.
  std::vector<size_t> order(plan.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return plan[a].bytes > plan[b].bytes;
  });
  std::map<int, int64_t> load;
  for (size_t i : order) {
    PlannedShard& p = plan[i];
    int best = p.holders[0];
    for (int h : p.holders) {
      if (load[h] < load[best]) best = h;
    }
    p.writer = best;
    load[best] += p.bytes;
  }
  return plan;
}

}  // namespace mcc
