#include "parallel/data_parallel/distributed_data_parallel.h"

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "core/comm/all_reduce_coalesced.h"
#include "core/ops/elementwise.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace data_parallel {

namespace {

// --overlap-param-gather: before each unit's forward, waits for the
// distributed optimizer's all-gathers of the buckets holding that unit's
// parameters only, so the rest keep arriving while the first layers
// compute (Megatron's forward pre-hook).
class ParamGatherHooks : public parallel::UnitHooks {
 public:
  ParamGatherHooks(DistributedDataParallel* ddp,
                   std::vector<ParameterList> units)
      : ddp_(ddp), units_(std::move(units)) {}

  absl::Status BeforeForward(int unit) override {
    if (unit < 0 || unit >= static_cast<int>(units_.size())) {
      return absl::OutOfRangeError(absl::StrCat("ParamGatherHooks: unit ", unit,
                                                " of a model with ",
                                                units_.size(), " units"));
    }
    return ddp_->WaitParamGather(units_[unit]);
  }
  // Only forwards wait here.
  bool AllowsSplitBackward() const override { return true; }

 private:
  DistributedDataParallel* ddp_;
  std::vector<ParameterList> units_;
};

// Parameter i's view of a bucket's flat buffer, shaped as its value.
absl::StatusOr<Tensor> ParamView(const FlatLayout& layout, size_t i,
                                 const Tensor& bucket_data) {
  const Tensor& value = layout.params[i]->value;
  const int64_t off = layout.offsets[i];
  MCC_ASSIGN_OR_RETURN(Tensor view,
                       bucket_data.Slice(off, off + value.numel()));
  return view.Reshape(value.shape());
}

// Cuts `buffer` into the buckets' padded ranges, in order, into each
// bucket's `data` member, and calls `visit(bucket, parameter, view)` with
// each parameter's view of its bucket's range.
template <typename Visit>
absl::Status SpreadOverBuckets(const Tensor& buffer,
                               std::vector<Bucket>& buckets,
                               Tensor Bucket::*data, Visit visit) {
  int64_t start = 0;
  for (Bucket& b : buckets) {
    const int64_t padded = b.layout.padded_numel;
    MCC_ASSIGN_OR_RETURN(b.*data, buffer.Slice(start, start + padded));
    for (size_t i = 0; i < b.layout.params.size(); ++i) {
      MCC_ASSIGN_OR_RETURN(Tensor view, ParamView(b.layout, i, b.*data));
      MCC_RETURN_IF_ERROR(visit(b, b.layout.params[i].get(), view));
    }
    start += padded;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedDataParallel>>
DistributedDataParallel::Create(const ParameterList& params,
                                comm::ProcessGroup* dp, DdpConfig config,
                                comm::ProcessGroup* tp) {
  if (params.empty()) {
    return absl::InvalidArgumentError("DistributedDataParallel: no parameters");
  }
  if (config.bucket_size_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedDataParallel: bucket size ",
                     config.bucket_size_bytes, " bytes must be positive"));
  }
  auto ddp =
      std::unique_ptr<DistributedDataParallel>(new DistributedDataParallel);
  ddp->config_ = config;
  MCC_RETURN_IF_ERROR(
      CheckHybridSharding(config.hybrid, dp, config.use_distributed_optimizer));
  ddp->dp_ = dp;
  ddp->shard_ = config.hybrid.ShardGroup(dp);
  ddp->cross_ =
      config.hybrid.enabled() ? config.hybrid.cross_instance : nullptr;
  ddp->tp_ = tp != nullptr && tp->size() > 1 ? tp : nullptr;
  ddp->params_ = params;
  // Buckets split into shards over the shard group (all of DP, or the
  // instance under HSDP).
  const int dp_size = ddp->shard_size();
  const int dp_rank = ddp->shard_rank();
  std::unordered_set<const Parameter*> seen;
  const DType dtype = params[0] ? params[0]->value.dtype() : DType::kFloat32;
  const Device device = params[0] ? params[0]->value.device() : Device::CPU();
  ddp->device_ = device;
  for (const auto& p : params) {
    if (p == nullptr || !p->value.defined()) {
      return absl::InvalidArgumentError(
          "DistributedDataParallel: a parameter is null or has no value");
    }
    if (!seen.insert(p.get()).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedDataParallel: parameter '", p->name, "' listed twice"));
    }
    if (p->value.device() != device) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedDataParallel: parameter '", p->name, "' is ",
          p->value.Describe(), ", but '", params[0]->name, "' lives on ",
          device.ToString(), " (the buffers live on one device)"));
    }
    if (config.use_distributed_optimizer && p->value.dtype() != dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedDataParallel: the distributed optimizer needs one "
          "parameter dtype, but '",
          params[0]->name, "' is ", DTypeName(dtype), " and '", p->name,
          "' is ", DTypeName(p->value.dtype())));
    }
    if (p->main_grad.defined() && (p->main_grad.numel() != p->value.numel() ||
                                   p->main_grad.device() != device)) {
      return absl::InvalidArgumentError(
          absl::StrCat("DistributedDataParallel: parameter '", p->name,
                       "' main_grad ", p->main_grad.Describe(),
                       " does not match its value ", p->value.Describe()));
    }
  }

  // Expert parameters (mixture of experts) in buckets of their own, after
  // the dense ones: they reduce over another group.
  ParameterList dense, experts;
  for (const auto& p : params)
    (p->expert_parallel ? experts : dense).push_back(p);
  if (!experts.empty()) {
    if (config.expert_data == nullptr && dp != nullptr && dp->size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "DistributedDataParallel: parameter '", experts[0]->name,
          "' is an expert weight (expert_parallel) but no expert-data-parallel "
          "group was given (DdpConfig::expert_data)"));
    }
    MCC_RETURN_IF_ERROR(
        CheckExpertHybridSharding(config.hybrid, config.expert_data));
  }
  // Buckets in reverse parameter order, each closed once it holds
  // bucket_size_bytes of fp32 gradients.
  const int64_t bucket_elems =
      std::max<int64_t>(1, config.bucket_size_bytes / 4);
  int64_t total = 0;
  for (const bool expert : {false, true}) {
    const ParameterList& list = expert ? experts : dense;
    if (list.empty()) continue;
    std::vector<ParameterList> bucket_params(1);
    int64_t used = 0;
    for (auto it = list.rbegin(); it != list.rend(); ++it) {
      bucket_params.back().push_back(*it);
      used = FlatLayout::Append(used, (*it)->value.numel());
      if (used >= bucket_elems && std::next(it) != list.rend()) {
        bucket_params.emplace_back();
        used = 0;
      }
    }
    // Expert buckets split over the expert-data group (its instance under
    // HSDP).
    comm::ProcessGroup* edp =
        config.hybrid.ExpertShardGroup(config.expert_data);
    const int shards = expert ? (edp == nullptr ? 1 : edp->size()) : dp_size;
    const int shard = expert ? (edp == nullptr ? 0 : edp->rank()) : dp_rank;
    for (const ParameterList& in_bucket : bucket_params) {
      Bucket b;
      b.index = static_cast<int>(ddp->buckets_.size());
      b.expert = expert;
      MCC_ASSIGN_OR_RETURN(
          b.layout,
          FlatLayout::Create(
              in_bucket, shards,
              absl::StrCat("DistributedDataParallel bucket ", b.index)));
      // This rank's pieces: its shard under the distributed optimizer, else
      // every parameter whole.
      b.local_pieces = config.use_distributed_optimizer
                           ? b.layout.Pieces(shard)
                           : b.layout.WholePieces();
      total += b.layout.padded_numel;
      ddp->buckets_.push_back(std::move(b));
    }
  }

  // The gradients move into their buffer before the parameter buffer is
  // made, so each old tensor is freed before the next full-size buffer is
  // allocated: setup holds three copies of the parameters at most, not four
  // (measured, bench preset, CP 4 ZeRO-1 fp32: the setup peak 356.6 MiB,
  // above every training step's 313 MiB).
  ddp->grad_buffer_ = Tensor::Zeros({total}, DType::kFloat32, device);
  MCC_RETURN_IF_ERROR(SpreadOverBuckets(
      ddp->grad_buffer_, ddp->buckets_, &Bucket::grad_data,
      [&](const Bucket& b, Parameter* p, Tensor g) -> absl::Status {
        if (p->main_grad.defined()) {
          MCC_RETURN_IF_ERROR(g.CopyFrom(p->main_grad));
        }
        p->main_grad = g;
        ddp->slots_[p] = Slot{b.index, false};
        return absl::OkStatus();
      }));
  if (config.use_distributed_optimizer) {
    ddp->param_buffer_ = Tensor::Zeros({total}, dtype, device);
    MCC_RETURN_IF_ERROR(SpreadOverBuckets(
        ddp->param_buffer_, ddp->buckets_, &Bucket::param_data,
        [](const Bucket&, Parameter* p, Tensor v) -> absl::Status {
          MCC_RETURN_IF_ERROR(v.CopyFrom(p->value));
          p->value = v;
          return absl::OkStatus();
        }));
  }
  const int nb = static_cast<int>(ddp->buckets_.size());
  ddp->pending_.resize(nb);
  ddp->grad_work_.resize(nb);
  ddp->param_work_.resize(nb);
  ddp->gather_input_.resize(nb);
  ddp->ResetReady();
  ddp->BeginTrace();
  VLOG(1) << "DistributedDataParallel: " << params.size() << " parameters in "
          << nb << " buckets, " << total << " fp32 gradient elements, DP "
          << dp_size
          << (config.use_distributed_optimizer ? ", distributed optimizer"
                                               : "");
  return ddp;
}

absl::StatusOr<std::unique_ptr<DistributedDataParallel>>
DistributedDataParallel::Wrap(const std::vector<parallel::Model*>& models,
                              comm::ProcessGroup* dp, DdpConfig config) {
  if (models.empty()) {
    return absl::InvalidArgumentError("DistributedDataParallel: no models");
  }
  ParameterList params;
  for (const parallel::Model* m : models) {
    if (m == nullptr) {
      return absl::InvalidArgumentError("DistributedDataParallel: null model");
    }
    params.insert(params.end(), m->parameters().begin(), m->parameters().end());
  }
  MCC_ASSIGN_OR_RETURN(auto ddp,
                       Create(params, dp, config, models[0]->tensor_group()));
  for (parallel::Model* m : models) {
    ddp->models_.push_back(m);
    ddp->grad_ready_hook_ids_.push_back(
        m->AddGradReadyHook(ddp->GradReadyHook()));
    if (config.overlap_param_gather && config.use_distributed_optimizer) {
      ddp->gather_hooks_.push_back(
          std::make_unique<ParamGatherHooks>(ddp.get(), m->units()));
      MCC_RETURN_IF_ERROR(m->AddUnitHooks(ddp->gather_hooks_.back().get()));
    }
  }
  return ddp;
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t i = 0; i < models_.size(); ++i) {
    models_[i]->RemoveGradReadyHook(grad_ready_hook_ids_[i]);
    if (i < gather_hooks_.size()) {
      models_[i]->RemoveUnitHooks(gather_hooks_[i].get());
    }
  }
  for (auto& w : grad_work_) {
    if (w) w->Wait().IgnoreError();
  }
  for (auto& w : param_work_) {
    if (w) w->Wait().IgnoreError();
  }
}

void DistributedDataParallel::BeginTrace() {
  trace_ = GradSyncTrace();
  trace_.launched.assign(buckets_.size(), absl::InfinitePast());
  trace_.launched_in_backward.assign(buckets_.size(), false);
  trace_.done_when_all_ready.assign(buckets_.size(), false);
}

void DistributedDataParallel::ResetReady() {
  for (Bucket& b : buckets_) {
    pending_[b.index] = static_cast<int>(b.layout.params.size());
  }
  for (auto& [p, slot] : slots_) slot.ready = false;
  for (auto& w : grad_work_) w.reset();
  ready_count_ = 0;
}

absl::Status DistributedDataParallel::LaunchBucket(int b, bool from_hook) {
  Bucket& bucket = buckets_[b];
  trace_.launched[b] = absl::Now();
  trace_.launched_in_backward[b] = from_hook;
  const int n = dp_size();
  comm::ProcessGroup* group = ReduceGroupOf(bucket);
  const int group_size = group == nullptr ? 1 : group->size();
  if (n == 1 && group_size == 1) {
    grad_work_[b] = comm::Work::Done(absl::OkStatus());
    return absl::OkStatus();
  }
  comm::ReduceOp op = comm::ReduceOp::kAvg;
  // Under HSDP the instance's average is not DP's: scale by 1/DP and sum;
  // so for the experts, summed over their data-parallel group.
  if (!config_.average_in_collective || cross_ != nullptr || bucket.expert) {
    op = comm::ReduceOp::kSum;
    MCC_ASSIGN_OR_RETURN(Tensor used,
                         bucket.grad_data.Slice(0, bucket.layout.numel));
    if (n > 1) {
      MCC_RETURN_IF_ERROR(
          ops::Scale(used, 1.0f / static_cast<float>(n), &used));
    }
  }
  if (group_size == 1) {  // Experts held by this rank alone.
    grad_work_[b] = comm::Work::Done(absl::OkStatus());
    return absl::OkStatus();
  }
  if (config_.use_distributed_optimizer) {
    comm::ProcessGroup* shard_group = ShardGroupOf(bucket);
    if (shard_group == nullptr || shard_group->size() == 1) {
      // HSDP with one rank per instance.
      grad_work_[b] = comm::Work::Done(absl::OkStatus());
      return absl::OkStatus();
    }
    const int64_t shard = bucket.layout.shard_numel();
    const int r = shard_group->rank();
    MCC_ASSIGN_OR_RETURN(Tensor out,
                         bucket.grad_data.Slice(r * shard, (r + 1) * shard));
    grad_work_[b] = shard_group->ReduceScatter(bucket.grad_data, &out, op);
  } else {
    grad_work_[b] = group->AllReduce(&bucket.grad_data, op);
  }
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::OnGradsReady(
    const std::vector<Parameter*>& ready) {
  if (!is_last_microbatch_) return absl::OkStatus();
  if (ready_count_ == 0) BeginTrace();
  for (Parameter* p : ready) {
    auto it = slots_.find(p);
    if (it == slots_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("DistributedDataParallel: gradient of parameter '",
                       p ? p->name : "null",
                       "' reported ready, but it is not in any bucket"));
    }
    if (it->second.ready) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DistributedDataParallel: gradient of parameter '", p->name,
          "' reported ready twice in one step (missing FinishGradSync?)"));
    }
    it->second.ready = true;
    ++ready_count_;
    const int b = it->second.bucket;
    if (--pending_[b] == 0 && config_.overlap_grad_reduce) {
      MCC_RETURN_IF_ERROR(LaunchBucket(b, /*from_hook=*/true));
    }
  }
  if (ready_count_ == static_cast<int>(slots_.size())) {
    trace_.all_grads_ready = absl::Now();
    for (size_t b = 0; b < buckets_.size(); ++b) {
      trace_.done_when_all_ready[b] =
          grad_work_[b] != nullptr && grad_work_[b]->IsCompleted();
    }
  }
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::FinishGradSync() {
  if (ready_count_ == 0) BeginTrace();
  trace_.finish_called = absl::Now();
  absl::Status status;
  for (size_t b = 0; b < buckets_.size() && status.ok(); ++b) {
    if (!grad_work_[b]) status = LaunchBucket(static_cast<int>(b), false);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!grad_work_[b]) continue;
    absl::Status s = grad_work_[b]->Wait();
    comm::ProcessGroup* cross = CrossGroupOf(buckets_[b]);
    if (s.ok() && cross != nullptr && cross->size() > 1) {
      // HSDP: the instance's reduced shard, summed over the instances
      // (once its reduce-scatter is done).
      comm::ProcessGroup* group = ShardGroupOf(buckets_[b]);
      const int r = group == nullptr ? 0 : group->rank();
      const int64_t shard = buckets_[b].layout.shard_numel();
      auto mine = buckets_[b].grad_data.Slice(r * shard, (r + 1) * shard);
      s = mine.ok() ? cross->AllReduceSync(&*mine, comm::ReduceOp::kSum)
                    : mine.status();
    }
    if (!s.ok() && status.ok()) {
      status = absl::Status(
          s.code(), absl::StrCat("data-parallel gradient reduction of bucket ",
                                 b, ": ", s.message()));
    }
  }
  trace_.finished = absl::Now();
  ResetReady();
  return status;
}

absl::Status DistributedDataParallel::BeginStep() {
  // With per-unit gather hooks each unit waits just before its forward.
  if (gather_hooks_.empty()) MCC_RETURN_IF_ERROR(FinishParamGather());
  ZeroGrads();
  return absl::OkStatus();
}

void DistributedDataParallel::ZeroGrads() { grad_buffer_.Zero(); }

absl::Status DistributedDataParallel::StartParamGather() {
  if (!config_.use_distributed_optimizer) return absl::OkStatus();
  // Forward order: the last bucket holds the first layers.
  for (int b = static_cast<int>(buckets_.size()) - 1; b >= 0; --b) {
    if (param_work_[b]) {
      MCC_RETURN_IF_ERROR(param_work_[b]->Wait());
    }
    Bucket& bucket = buckets_[b];
    comm::ProcessGroup* shard_group = ShardGroupOf(bucket);
    if (shard_group == nullptr || shard_group->size() == 1) continue;
    const int r = shard_group->rank();
    const int64_t shard = bucket.layout.shard_numel();
    MCC_ASSIGN_OR_RETURN(Tensor mine,
                         bucket.param_data.Slice(r * shard, (r + 1) * shard));
    if (!gather_input_[b].defined()) gather_input_[b] = mine.Clone();
    MCC_RETURN_IF_ERROR(gather_input_[b].CopyFrom(mine));
    param_work_[b] =
        shard_group->AllGather(gather_input_[b], &bucket.param_data);
  }
  param_trace_ = ParamGatherTrace();
  if (!config_.overlap_param_gather) return FinishParamGather();
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::FinishParamGather() {
  absl::Status status;
  for (int b = static_cast<int>(buckets_.size()) - 1; b >= 0; --b) {
    if (!param_work_[b]) continue;
    absl::Status s = param_work_[b]->Wait();
    param_work_[b].reset();
    if (!s.ok() && status.ok()) {
      status = absl::Status(
          s.code(),
          absl::StrCat("data-parallel parameter all-gather of bucket ", b, ": ",
                       s.message()));
    }
  }
  return status;
}

absl::Status DistributedDataParallel::WaitParamGather(
    const ParameterList& params) {
  for (const auto& p : params) {
    auto it = slots_.find(p.get());
    if (it == slots_.end()) continue;
    const int b = it->second.bucket;
    if (!param_work_[b]) continue;
    if (param_trace_.waited_in_forward.empty()) {
      for (const auto& work : param_work_) {
        if (!work) continue;
        ++param_trace_.pending_at_first_wait;
        if (!work->IsCompleted()) ++param_trace_.incomplete_at_first_wait;
      }
    }
    param_trace_.waited_in_forward.push_back(b);
    absl::Status s = param_work_[b]->Wait();
    param_work_[b].reset();
    if (!s.ok()) {
      return absl::Status(
          s.code(),
          absl::StrCat("data-parallel parameter all-gather of bucket ", b,
                       " (holding ", p->name, "): ", s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status DistributedDataParallel::FinalizeGradients() {
  if (tp_ == nullptr) return absl::OkStatus();
  // Sequence parallelism leaves the gradients of the parameters it applies
  // to a TP rank's own tokens (norms) partial: sum them over TP.
  // In one collective (as Megatron coalesces them), not one each.
  std::vector<Tensor*> grads;
  Tensor skipped;  // The test hook's copy: reduced, then dropped.
  for (const auto& p : params_) {
    if (!p->sequence_parallel) continue;
    if (p->name == config_.skip_sequence_parallel_reduce_for_testing) {
      skipped = Tensor::Empty(p->main_grad.shape(), DType::kFloat32,
                              p->main_grad.device());
      MCC_RETURN_IF_ERROR(skipped.CopyFrom(p->main_grad));
      grads.push_back(&skipped);
      continue;
    }
    grads.push_back(&p->main_grad);
  }
  return comm::AllReduceCoalescedSync(tp_, grads, comm::ReduceOp::kSum);
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>>
DistributedDataParallel::CreateOptimizer(const optim::OptimizerConfig& config,
                                         const optim::OptimizerGroups& groups) {
  optim::OptimizerPieces pieces;
  for (const Bucket& b : buckets_) {
    for (const FlatPiece& piece : b.local_pieces) {
      optim::ExternalShard s;  // No value/grad: views the parameter's own.
      s.param = b.layout.params[piece.param];
      s.begin = piece.begin;
      s.end = piece.end;
      s.param_shape = b.layout.shapes[piece.param];
      pieces.pieces.push_back(std::move(s));
    }
  }
  pieces.sharded = config_.use_distributed_optimizer;
  pieces.shard_group = shard_;
  pieces.expert_shard_group =
      config_.hybrid.ExpertShardGroup(config_.expert_data);
  for (const Bucket& b : buckets_) pieces.expert_params |= b.expert;
  pieces.device = device_;
  if (config_.use_distributed_optimizer) {
    // The updated shards go to every replica (waited for by
    // FinishParamGather, or per unit with --overlap-param-gather).
    pieces.after_update = [this] { return StartParamGather(); };
  }
  return optim::Optimizer::CreateForPieces(std::move(pieces), config, groups);
}

std::string DistributedDataParallel::Describe() const {
  std::string out = config_.use_distributed_optimizer
                        ? "optim (distributed optimizer)"
                        : "no_shard";
  if (cross_ != nullptr) {
    absl::StrAppend(&out, "; HSDP: ", cross_->size(), " instances of ",
                    shard_size(), " ranks");
  }
  // Buckets and overlap matter only where something is reduced.
  if (dp_size() > 1) {
    absl::StrAppend(&out, "; ", buckets_.size(), " gradient buckets of ",
                    config_.bucket_size_bytes / 4, " elements, ",
                    config_.overlap_grad_reduce ? "reduced during backward"
                                                : "reduced after backward");
    if (config_.use_distributed_optimizer) {
      absl::StrAppend(&out, "; parameters gathered ",
                      config_.overlap_param_gather ? "during the next forward"
                                                   : "after the step");
    }
  }
  return out;
}

}  // namespace data_parallel
}  // namespace mcc
