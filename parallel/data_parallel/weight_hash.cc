#include "parallel/data_parallel/weight_hash.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace mcc {
namespace data_parallel {

uint64_t HashTensorBytes(const Tensor& t) {
  uint64_t h = 1469598103934665603ULL;
  if (!t.defined()) return h;
  const auto* p = static_cast<const unsigned char*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

absl::Status CheckWeightHashAcrossReplicas(const ParameterList& params,
                                           comm::ProcessGroup* dp) {
  return CheckWeightHash(ReplicaGroup{"data-parallel", dp, params});
}

absl::Status CheckWeightHashAcrossReplicaGroups(
    const std::vector<ReplicaGroup>& groups) {
  for (const ReplicaGroup& g : groups) {
    MCC_RETURN_IF_ERROR(CheckWeightHash(g));
  }
  return absl::OkStatus();
}

absl::Status CheckWeightHash(const ReplicaGroup& replicas) {
  comm::ProcessGroup* dp = replicas.group;
  const ParameterList& params = replicas.params;
  const std::string& kind = replicas.kind;
  if (dp == nullptr || dp->size() == 1 || params.empty()) {
    return absl::OkStatus();
  }
  const int64_t n = static_cast<int64_t>(params.size());
  // A check, not the training step: each parameter is read through one
  // explicit copy to the host (none on the CPU), and the hashes travel on
  // the group's device.
  Tensor mine = Tensor::Empty({n}, DType::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    Tensor host = params[i]->value;
    if (host.defined() && !host.device().is_cpu()) {
      MCC_ASSIGN_OR_RETURN(host, host.To(Device::CPU()));
    }
    mine.data<int64_t>()[i] = static_cast<int64_t>(HashTensorBytes(host));
  }
  const Device device = dp->device();
  Tensor all = Tensor::Empty({dp->size() * n}, DType::kInt64, device);
  if (device.is_cpu()) {
    MCC_RETURN_IF_ERROR(dp->AllGatherSync(mine, &all));
  } else {
    MCC_ASSIGN_OR_RETURN(Tensor on_device, mine.To(device));
    MCC_RETURN_IF_ERROR(dp->AllGatherSync(on_device, &all));
    MCC_ASSIGN_OR_RETURN(all, all.To(Device::CPU()));
  }
  const int64_t* h = all.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    std::map<int64_t, std::vector<int>> ranks_by_hash;
    for (int r = 0; r < dp->size(); ++r)
      ranks_by_hash[h[r * n + i]].push_back(r);
    if (ranks_by_hash.size() == 1) continue;
    std::vector<std::string> groups;
    for (const auto& [hash, ranks] : ranks_by_hash) {
      std::vector<int> global;
      for (int r : ranks) global.push_back(dp->global_ranks()[r]);
      groups.push_back(absl::StrFormat(
          "hash %016x on %s ranks {%s} (global ranks {%s})",
          static_cast<uint64_t>(hash), kind, absl::StrJoin(ranks, ", "),
          absl::StrJoin(global, ", ")));
    }
    return absl::InternalError(absl::StrCat(
        "weight hash check across ", kind, " replicas (group '", dp->name(),
        "'): parameter '", params[i]->name, "' ", params[i]->value.Describe(),
        " differs: ", absl::StrJoin(groups, "; ")));
  }
  return absl::OkStatus();
}

}  // namespace data_parallel
}  // namespace mcc
