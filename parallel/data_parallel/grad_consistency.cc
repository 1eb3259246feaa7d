#include "parallel/data_parallel/grad_consistency.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "parallel/data_parallel/weight_hash.h"

namespace mcc {
namespace data_parallel {
namespace {

// All-gathers a host tensor over `group`, travelling on the group's device.
absl::StatusOr<Tensor> AllGatherToHost(comm::ProcessGroup* group,
                                       const Tensor& mine) {
  const Device device = group->device();
  Tensor all =
      Tensor::Empty({group->size() * mine.numel()}, mine.dtype(), device);
  if (device.is_cpu()) {
    MCC_RETURN_IF_ERROR(group->AllGatherSync(mine, &all));
    return all;
  }
  MCC_ASSIGN_OR_RETURN(Tensor on_device, mine.To(device));
  MCC_RETURN_IF_ERROR(group->AllGatherSync(on_device, &all));
  return all.To(Device::CPU());
}

absl::StatusOr<Tensor> HostFp32(const Tensor& t) {
  if (!t.defined()) return Tensor::Empty({0}, DType::kFloat32);
  Tensor host = t;
  if (!host.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(host, host.To(Device::CPU()));
  }
  if (host.dtype() != DType::kFloat32) {
    MCC_ASSIGN_OR_RETURN(host, host.To(DType::kFloat32));
  }
  return host.Reshape({host.numel()});
}

// Largest |a - b|, a NaN on one side only counting as infinite.
double MaxDifference(const float* a, const float* b, int64_t n) {
  double worst = 0;
  for (int64_t k = 0; k < n; ++k) {
    const bool na = std::isnan(a[k]), nb = std::isnan(b[k]);
    if (na || nb) {
      if (na != nb) return std::numeric_limits<double>::infinity();
      continue;
    }
    worst = std::max(worst, std::abs(static_cast<double>(a[k]) - b[k]));
  }
  return worst;
}

}  // namespace

absl::Status CheckGradConsistency(const ReplicaGroup& replicas,
                                  const HeldGradientFn& held,
                                  double tolerance) {
  comm::ProcessGroup* group = replicas.group;
  const ParameterList& params = replicas.params;
  if (group == nullptr || group->size() == 1 || params.empty()) {
    return absl::OkStatus();
  }
  const int size = group->size();
  const int64_t n = static_cast<int64_t>(params.size());
  std::vector<Tensor> grads;
  // Per parameter: the hash of the gradient's bytes and its element count.
  Tensor mine = Tensor::Empty({2 * n}, DType::kInt64);
  for (int64_t i = 0; i < n; ++i) {
    MCC_ASSIGN_OR_RETURN(Tensor g, held(*params[i]));
    MCC_ASSIGN_OR_RETURN(g, HostFp32(g));
    mine.data<int64_t>()[i] = static_cast<int64_t>(HashTensorBytes(g));
    mine.data<int64_t>()[n + i] = g.numel();
    grads.push_back(std::move(g));
  }
  MCC_ASSIGN_OR_RETURN(Tensor all, AllGatherToHost(group, mine));
  const int64_t* h = all.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    bool same = true;
    for (int r = 1; r < size; ++r) {
      same = same && h[r * 2 * n + i] == h[i];
      if (h[r * 2 * n + n + i] != h[n + i]) {
        return absl::InternalError(
            absl::StrCat("gradient consistency check across ", replicas.kind,
                         " replicas (group '", group->name(), "'): parameter '",
                         params[i]->name, "' holds ", h[n + i],
                         " gradient elements on ", replicas.kind,
                         " rank 0 but ", h[r * 2 * n + n + i], " on rank ", r));
      }
    }
    if (same) continue;
    // Every rank saw the same hashes, so all gather this one together.
    MCC_ASSIGN_OR_RETURN(Tensor values, AllGatherToHost(group, grads[i]));
    const int64_t m = grads[i].numel();
    const float* v = values.data<float>();
    double worst = -1;
    int ra = 0, rb = 0;
    for (int a = 0; a < size; ++a) {
      for (int b = a + 1; b < size; ++b) {
        const double d = MaxDifference(v + a * m, v + b * m, m);
        if (d > worst) {
          worst = d;
          ra = a;
          rb = b;
        }
      }
    }
    if (worst <= tolerance) continue;
    return absl::InternalError(absl::StrFormat(
        "gradient consistency check across %s replicas (group '%s'): the "
        "gradient of parameter '%s' %s differs between %s ranks %d and %d "
        "(global ranks %d and %d) by up to %.6g (tolerance %g): its "
        "reduction over this group went wrong",
        replicas.kind, group->name(), params[i]->name,
        params[i]->main_grad.defined() ? params[i]->main_grad.Describe()
                                       : absl::StrCat("[", m, " held]"),
        replicas.kind, ra, rb, group->global_ranks()[ra],
        group->global_ranks()[rb], worst, tolerance));
  }
  return absl::OkStatus();
}

HeldGradientFn HeldGradientsOf(const DataParallel* dp) {
  if (dp == nullptr) {
    return [](const Parameter& p) -> absl::StatusOr<Tensor> {
      return p.main_grad;
    };
  }
  return [dp](const Parameter& p) { return dp->HeldGradient(p); };
}

std::vector<ReplicaGroup> GradientReplicaGroups(
    const ParameterList& params, const ReplicaGroupSources& sources,
    const DataParallel* dp) {
  ReplicaGroupSources comparable = sources;
  if (dp != nullptr && !dp->holds_whole_reduced_gradients()) {
    // Each rank holds its own shard, over DP or (with context parallelism)
    // over DP x CP, so neither group's ranks hold comparable tensors.
    comparable.data = nullptr;
    comparable.context = nullptr;
  }
  if (dp != nullptr && dp->shards_gradients()) comparable.embedding = nullptr;
  return ReplicaGroupsOf(params, comparable);
}

absl::Status CheckGradConsistencyAcrossReplicaGroups(
    const std::vector<ReplicaGroup>& groups, const HeldGradientFn& held,
    double tolerance) {
  for (const ReplicaGroup& g : groups) {
    MCC_RETURN_IF_ERROR(CheckGradConsistency(g, held, tolerance));
  }
  return absl::OkStatus();
}

}  // namespace data_parallel
}  // namespace mcc
