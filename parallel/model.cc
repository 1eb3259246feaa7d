#include "parallel/model.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/comm/all_reduce_coalesced.h"
#include "core/ops/elementwise.h"
#include "core/status_macros.h"

namespace mcc {
namespace parallel {

absl::Status UnitHooks::BeforeForward(int) { return absl::OkStatus(); }
absl::Status UnitHooks::AfterForward(int) { return absl::OkStatus(); }
absl::Status UnitHooks::BeforeBackward(int) { return absl::OkStatus(); }
absl::Status UnitHooks::AfterBackward(int) { return absl::OkStatus(); }

absl::Status Model::AddUnitHooks(UnitHooks* hooks) {
  if (hooks == nullptr) {
    return absl::InvalidArgumentError("AddUnitHooks: null hooks");
  }
  if (std::find(unit_hooks_.begin(), unit_hooks_.end(), hooks) !=
      unit_hooks_.end()) {
    return absl::InvalidArgumentError(
        "AddUnitHooks: these hooks are already installed on the model");
  }
  unit_hooks_.push_back(hooks);
  return absl::OkStatus();
}

void Model::RemoveUnitHooks(UnitHooks* hooks) {
  unit_hooks_.erase(std::remove(unit_hooks_.begin(), unit_hooks_.end(), hooks),
                    unit_hooks_.end());
}

int Model::AddGradReadyHook(GradReadyHook hook) {
  if (!hook) return -1;
  const int id = next_grad_ready_id_++;
  grad_ready_hooks_.emplace_back(id, std::move(hook));
  return id;
}

void Model::RemoveGradReadyHook(int id) {
  grad_ready_hooks_.erase(
      std::remove_if(grad_ready_hooks_.begin(), grad_ready_hooks_.end(),
                     [id](const auto& h) { return h.first == id; }),
      grad_ready_hooks_.end());
}

absl::StatusOr<LossSum> ReadLossSum(const Tensor& loss_sum) {
  if (!loss_sum.defined() || loss_sum.dtype() != DType::kFloat32 ||
      loss_sum.numel() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "loss sum ", loss_sum.defined() ? loss_sum.Describe() : "(undefined)",
        " is not an fp32 [4] tensor"));
  }
  Tensor host = loss_sum;
  if (!loss_sum.device().is_cpu()) {
    // The one device-to-host copy.
    MCC_ASSIGN_OR_RETURN(host, loss_sum.To(Device::CPU()));
  }
  const float* p = host.data<float>();
  LossSum out;
  out.sum = static_cast<double>(p[0]) + static_cast<double>(p[1]);
  out.tokens = static_cast<double>(p[2]) + static_cast<double>(p[3]);
  return out;
}

void Model::ZeroGradients() {
  for (const auto& p : parameters()) p->main_grad.Zero();
}

absl::Status Model::SyncSharedGradients(comm::ProcessGroup* embedding_group) {
  std::vector<Parameter*> shared;
  for (const auto& p : parameters()) {
    if (p->shared_with_other_stage) shared.push_back(p.get());
  }
  if (shared.empty()) return absl::OkStatus();
  if (embedding_group != nullptr && embedding_group->size() > 1) {
    for (Parameter* p : shared) {
      MCC_RETURN_IF_ERROR(
          embedding_group->AllReduceSync(&p->main_grad, comm::ReduceOp::kSum));
    }
  }
  for (const auto& [id, hook] : grad_ready_hooks_) {
    MCC_RETURN_IF_ERROR(hook(shared));
  }
  return absl::OkStatus();
}

absl::Status Model::FinalizeGradients() {
  comm::ProcessGroup* tp = tensor_group();
  if (tp == nullptr || tp->size() == 1) return absl::OkStatus();
  // One collective for all of them (norms and row-parallel biases: six a
  // layer), not one each.
  std::vector<Tensor*> grads;
  for (const auto& p : parameters()) {
    if (p->sequence_parallel) grads.push_back(&p->main_grad);
  }
  return comm::AllReduceCoalescedSync(tp, grads, comm::ReduceOp::kSum);
}

absl::Status Model::CallUnitHooks(absl::Status (UnitHooks::*fn)(int),
                                  int unit) const {
  if (unit < 0) return absl::OkStatus();
  for (UnitHooks* hooks : unit_hooks_) {
    MCC_RETURN_IF_ERROR((hooks->*fn)(unit));
  }
  return absl::OkStatus();
}

bool Model::UnitHooksAllowSplitBackward() const {
  for (const UnitHooks* hooks : unit_hooks_) {
    if (!hooks->AllowsSplitBackward()) return false;
  }
  return true;
}

absl::Status Model::CallBeforeForward(int unit) const {
  return CallUnitHooks(&UnitHooks::BeforeForward, unit);
}
absl::Status Model::CallAfterForward(int unit) const {
  return CallUnitHooks(&UnitHooks::AfterForward, unit);
}
absl::Status Model::CallBeforeBackward(int unit) const {
  return CallUnitHooks(&UnitHooks::BeforeBackward, unit);
}
absl::Status Model::CallAfterBackward(int unit) const {
  return CallUnitHooks(&UnitHooks::AfterBackward, unit);
}

absl::Status Model::CallGradsReady(const ParameterList& params) const {
  if (grad_ready_hooks_.empty()) return absl::OkStatus();
  std::vector<Parameter*> ready;
  for (const auto& p : params) {
    // A shared weight is ready only once summed with the other stage's.
    if (!p->shared_with_other_stage) ready.push_back(p.get());
  }
  if (ready.empty()) return absl::OkStatus();
  for (const auto& [id, hook] : grad_ready_hooks_) {
    MCC_RETURN_IF_ERROR(hook(ready));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> PipelineStage::BackwardInputStep(
    const Tensor& output_grad, float grad_scale,
    std::unique_ptr<ActivationRecord>* record) {
  // Not split: the weight gradients are computed here too.
  return BackwardStep(output_grad, grad_scale, std::move(*record));
}

absl::Status PipelineStage::BackwardWeightStep(
    std::unique_ptr<ActivationRecord> record) {
  if (record != nullptr) {
    return absl::InvalidArgumentError(
        "BackwardWeightStep: this chunk does not split its backward, so its "
        "BackwardInputStep leaves no record for the weight gradient");
  }
  return absl::OkStatus();
}

absl::Status SumSharedGradientsWithinStage(const std::vector<Model*>& models) {
  std::map<std::string, std::vector<Parameter*>> copies;
  for (Model* model : models) {
    for (const auto& p : model->parameters()) {
      if (p->shared_with_other_stage) copies[p->name].push_back(p.get());
    }
  }
  for (auto& [name, list] : copies) {
    if (list.size() < 2) continue;
    Tensor& sum = list[0]->main_grad;
    for (size_t i = 1; i < list.size(); ++i) {
      if (list[i]->main_grad.shape() != sum.shape()) {
        return absl::InvalidArgumentError(
            absl::StrCat("shared parameter '", name,
                         "': the stage's copies differ in shape"));
      }
      MCC_RETURN_IF_ERROR(ops::Add(sum, list[i]->main_grad, &sum));
    }
    for (size_t i = 1; i < list.size(); ++i) {
      MCC_RETURN_IF_ERROR(list[i]->main_grad.CopyFrom(sum));
    }
  }
  return absl::OkStatus();
}

}  // namespace parallel
}  // namespace mcc
