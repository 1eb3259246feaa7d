#include "parallel/fsdp/checkpoint_interop.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/checked_math.h"
#include "core/status_macros.h"

namespace mcc {
namespace fsdp {
namespace {

std::string StateKey(const std::string& state, const std::string& param) {
  return absl::StrCat("optimizer.", state, ".", param);
}

// The whole flat state of one parameter from this rank's piece (if any):
// the pieces of the DP ranks follow each other in rank order.
// Checkpoint tensors live on the host: a device tensor is read through one
// explicit copy (a plain clone on the CPU).
absl::StatusOr<Tensor> ToHost(const Tensor& t) {
  if (t.device().is_cpu()) return t.Clone();
  return t.To(Device::CPU());
}

// dst = host_src converted to dst's dtype, written through the device's
// copy hook (one explicit host-to-device copy off the CPU).
absl::Status WriteConverted(const Tensor& host_src, Tensor* dst) {
  MCC_ASSIGN_OR_RETURN(Tensor converted, host_src.To(dst->dtype()));
  MCC_ASSIGN_OR_RETURN(converted, converted.Reshape(dst->shape()));
  return dst->CopyFrom(converted);
}

absl::StatusOr<Tensor> WholeState(const optim::StateTensor* mine, int64_t n,
                                  bool sharded, comm::ProcessGroup* dp) {
  if (!sharded) {
    if (mine == nullptr || mine->tensor.numel() != n) {
      return absl::InternalError(
          "optimizer state does not cover the whole "
          "parameter on an unsharded optimizer");
    }
    return ToHost(mine->tensor);
  }
  const Device device = dp->device();
  Tensor piece = mine != nullptr ? mine->tensor
                                 : Tensor::Empty({0}, DType::kFloat32, device);
  // Gathered in fp32 whatever each rank stores it in (a lowered state's
  // dtype, --exp-avg-dtype and the like).
  if (piece.dtype() != DType::kFloat32) {
    MCC_ASSIGN_OR_RETURN(piece, piece.To(DType::kFloat32));
  }
  // A piece the optimizer keeps in host memory (--optimizer-cpu-offload)
  // joins the group's gather on the group's device.
  if (piece.device() != device) {
    MCC_ASSIGN_OR_RETURN(piece, piece.To(device));
  }
  MCC_ASSIGN_OR_RETURN(piece, piece.Reshape({-1}));
  Tensor count =
      Tensor::Full({1}, static_cast<double>(piece.numel()), DType::kInt64);
  Tensor counts = Tensor::Empty({dp->size()}, DType::kInt64, device);
  if (!device.is_cpu()) {
    MCC_ASSIGN_OR_RETURN(count, count.To(device));
  }
  MCC_RETURN_IF_ERROR(dp->AllGatherSync(count, &counts));
  MCC_ASSIGN_OR_RETURN(counts, ToHost(counts));
  std::vector<int64_t> rows(dp->size());
  int64_t total = 0;
  for (int r = 0; r < dp->size(); ++r) {
    // A peer's count sizes the gather: checked before it reaches one.
    rows[r] = counts.data<int64_t>()[r];
    if (rows[r] < 0 || rows[r] > n) {
      return absl::InternalError(absl::StrCat(
          "sharded optimizer state: rank ", r, " of group '", dp->name(),
          "' announced ", rows[r], " of ", n, " elements"));
    }
    total = CheckedAdd(total, rows[r]).value_or(-1);
  }
  if (total != n) {
    return absl::InternalError(absl::StrCat("sharded optimizer state holds ",
                                            total, " of ", n, " elements"));
  }
  Tensor whole = Tensor::Empty({n}, DType::kFloat32, device);
  MCC_RETURN_IF_ERROR(dp->AllGatherVSync(piece, &whole, rows));
  if (device.is_cpu()) return whole;
  return ToHost(whole);
}

}  // namespace

absl::StatusOr<TrainingTensors> GatherTrainingTensors(
    const ParameterList& params, data_parallel::DataParallel* fsdp,
    optim::Optimizer* optimizer, comm::ProcessGroup* dp) {
  if (fsdp != nullptr) MCC_RETURN_IF_ERROR(fsdp->GatherFullParams());
  TrainingTensors out;
  for (const auto& p : params) {
    MCC_ASSIGN_OR_RETURN(out[p->name], ToHost(p->value));
  }
  if (optimizer != nullptr) {
    // By parameter: ZB-V's stage 0 holds two copies of the tied embedding
    // under one name, each gathering its own pieces.
    std::map<std::pair<const Parameter*, std::string>, optim::StateTensor>
        index;
    std::vector<std::string> states;
    for (auto& s : optimizer->StateTensors()) {
      if (std::find(states.begin(), states.end(), s.state) == states.end()) {
        states.push_back(s.state);
      }
      index[{s.param, s.state}] = s;
    }
    // The state splits over the optimizer's shard group (an instance
    // under HSDP), which is `dp` otherwise; expert weights' over the
    // expert-data group.
    if (optimizer->shard_group() != nullptr) dp = optimizer->shard_group();
    for (const auto& p : params) {
      // Expert weights' state splits over the expert-data-parallel group.
      comm::ProcessGroup* group =
          p->expert_parallel ? optimizer->expert_shard_group() : dp;
      const bool sharded =
          optimizer->sharded() && group != nullptr && group->size() > 1;
      for (const std::string& state : states) {
        auto it = index.find({p.get(), state});
        auto whole = WholeState(it == index.end() ? nullptr : &it->second,
                                p->value.numel(), sharded, group);
        if (!whole.ok()) {
          return absl::Status(whole.status().code(),
                              absl::StrCat(StateKey(state, p->name), ": ",
                                           whole.status().message()));
        }
        MCC_ASSIGN_OR_RETURN(out[StateKey(state, p->name)],
                             whole->Reshape(p->value.shape()));
      }
    }
  }
  if (fsdp != nullptr) MCC_RETURN_IF_ERROR(fsdp->ReleaseFullParams());
  return out;
}

absl::Status ScatterTrainingTensors(const TrainingTensors& tensors,
                                    const ParameterList& params,
                                    data_parallel::DataParallel* fsdp,
                                    optim::Optimizer* optimizer) {
  if (fsdp != nullptr) MCC_RETURN_IF_ERROR(fsdp->GatherFullParams());
  for (const auto& p : params) {
    auto it = tensors.find(p->name);
    if (it == tensors.end() || it->second.numel() != p->value.numel()) {
      return absl::NotFoundError(absl::StrCat(
          "no tensor of ", p->value.numel(), " elements for parameter '",
          p->name, "'",
          it == tensors.end()
              ? ""
              : absl::StrCat(" (found ", it->second.Describe(), ")")));
    }
    MCC_RETURN_IF_ERROR(WriteConverted(it->second, &p->value));
  }
  if (fsdp != nullptr) MCC_RETURN_IF_ERROR(fsdp->ScatterFullParams());
  if (optimizer != nullptr) {
    for (auto& s : optimizer->StateTensors()) {
      const std::string key = StateKey(s.state, s.param_name);
      auto it = tensors.find(key);
      if (it == tensors.end() ||
          it->second.numel() < s.offset + s.tensor.numel()) {
        return absl::NotFoundError(
            absl::StrCat("no optimizer state '", key, "' covering elements [",
                         s.offset, ", ", s.offset + s.tensor.numel(), ")"));
      }
      MCC_ASSIGN_OR_RETURN(Tensor flat, it->second.Reshape({-1}));
      MCC_ASSIGN_OR_RETURN(Tensor piece,
                           flat.Slice(s.offset, s.offset + s.tensor.numel()));
      MCC_RETURN_IF_ERROR(WriteConverted(piece, &s.tensor));
    }
  }
  if (fsdp != nullptr) MCC_RETURN_IF_ERROR(fsdp->ReleaseFullParams());
  return absl::OkStatus();
}

}  // namespace fsdp
}  // namespace mcc
