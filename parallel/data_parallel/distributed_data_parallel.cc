#include "parallel/data_parallel/distributed_data_parallel.h"

#include <algorithm>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "core/ops/elementwise.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace data_parallel {

namespace {

// Parameter starts and bucket sizes are multiples of this many elements
// (64 bytes of fp32), so every view stays cache-line aligned.
constexpr int64_t kAlign = 16;

int64_t RoundUp(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedDataParallel>>
DistributedDataParallel::Create(const ParameterList& params,
                                comm::ProcessGroup* dp, DdpConfig config) {
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
  ddp->dp_ = dp;
  ddp->params_ = params;
  const int dp_size = ddp->dp_size();
  const int dp_rank = ddp->dp_rank();
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

  // Buckets in reverse parameter order.
  const int64_t bucket_elems =
      std::max<int64_t>(1, config.bucket_size_bytes / 4);
  const int64_t pad = kAlign * dp_size;
  Bucket current;
  auto close = [&] {
    current.index = static_cast<int>(ddp->buckets_.size());
    current.dp_size = dp_size;
    current.padded_numel = RoundUp(std::max<int64_t>(current.numel, 1), pad);
    ddp->buckets_.push_back(std::move(current));
    current = Bucket();
  };
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    Parameter* p = it->get();
    current.params.push_back(p);
    current.offsets.push_back(current.numel);
    current.numel = RoundUp(current.numel + p->value.numel(), kAlign);
    if (current.numel >= bucket_elems) close();
  }
  if (!current.params.empty()) close();

  int64_t total = 0;
  for (const Bucket& b : ddp->buckets_) total += b.padded_numel;
  ddp->grad_buffer_ = Tensor::Zeros({total}, DType::kFloat32, device);
  if (config.use_distributed_optimizer) {
    ddp->param_buffer_ = Tensor::Zeros({total}, dtype, device);
  }
  int64_t start = 0;
  for (Bucket& b : ddp->buckets_) {
    MCC_ASSIGN_OR_RETURN(
        b.grad_data, ddp->grad_buffer_.Slice(start, start + b.padded_numel));
    if (config.use_distributed_optimizer) {
      MCC_ASSIGN_OR_RETURN(b.param_data, ddp->param_buffer_.Slice(
                                             start, start + b.padded_numel));
    }
    for (size_t i = 0; i < b.params.size(); ++i) {
      Parameter* p = b.params[i];
      const int64_t off = b.offsets[i], n = p->value.numel();
      MCC_ASSIGN_OR_RETURN(Tensor g, b.grad_data.Slice(off, off + n));
      MCC_ASSIGN_OR_RETURN(g, g.Reshape(p->value.shape()));
      if (p->main_grad.defined()) MCC_RETURN_IF_ERROR(g.CopyFrom(p->main_grad));
      p->main_grad = g;
      if (config.use_distributed_optimizer) {
        MCC_ASSIGN_OR_RETURN(Tensor v, b.param_data.Slice(off, off + n));
        MCC_ASSIGN_OR_RETURN(v, v.Reshape(p->value.shape()));
        MCC_RETURN_IF_ERROR(v.CopyFrom(p->value));
        p->value = v;
      }
      ddp->slots_[p] = Slot{b.index, false};
    }
    start += b.padded_numel;
  }

  // This rank's pieces of the parameters.
  std::unordered_map<const Parameter*, std::shared_ptr<Parameter>> owner;
  for (const auto& p : params) owner[p.get()] = p;
  for (const Bucket& b : ddp->buckets_) {
    const int64_t shard = b.padded_numel / dp_size;
    const int64_t lo = config.use_distributed_optimizer ? dp_rank * shard : 0;
    const int64_t hi =
        config.use_distributed_optimizer ? lo + shard : b.padded_numel;
    for (size_t i = 0; i < b.params.size(); ++i) {
      const int64_t off = b.offsets[i];
      const int64_t end = off + b.params[i]->value.numel();
      const int64_t s = std::max(off, lo), e = std::min(end, hi);
      if (s >= e) continue;
      ParamShard ps;
      ps.param = owner[b.params[i]];
      ps.begin = s - off;
      ps.end = e - off;
      ps.bucket = b.index;
      ps.bucket_offset = s;
      ddp->shards_.push_back(ps);
    }
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

DistributedDataParallel::~DistributedDataParallel() {
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
    pending_[b.index] = static_cast<int>(b.params.size());
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
  if (n == 1) {
    grad_work_[b] = comm::Work::Done(absl::OkStatus());
    return absl::OkStatus();
  }
  comm::ReduceOp op = comm::ReduceOp::kAvg;
  if (!config_.average_in_collective) {
    op = comm::ReduceOp::kSum;
    MCC_ASSIGN_OR_RETURN(Tensor used, bucket.grad_data.Slice(0, bucket.numel));
    MCC_RETURN_IF_ERROR(ops::Scale(used, 1.0f / static_cast<float>(n), &used));
  }
  if (config_.use_distributed_optimizer) {
    const int64_t shard = bucket.padded_numel / n;
    MCC_ASSIGN_OR_RETURN(
        Tensor out,
        bucket.grad_data.Slice(dp_rank() * shard, (dp_rank() + 1) * shard));
    grad_work_[b] = dp_->ReduceScatter(bucket.grad_data, &out, op);
  } else {
    grad_work_[b] = dp_->AllReduce(&bucket.grad_data, op);
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

void DistributedDataParallel::ZeroGrads() { grad_buffer_.Zero(); }

absl::Status DistributedDataParallel::StartParamGather() {
  if (!config_.use_distributed_optimizer || dp_size() == 1) {
    return absl::OkStatus();
  }
  const int n = dp_size(), r = dp_rank();
  // Forward order: the last bucket holds the first layers.
  for (int b = static_cast<int>(buckets_.size()) - 1; b >= 0; --b) {
    if (param_work_[b]) {
      MCC_RETURN_IF_ERROR(param_work_[b]->Wait());
    }
    Bucket& bucket = buckets_[b];
    const int64_t shard = bucket.padded_numel / n;
    MCC_ASSIGN_OR_RETURN(Tensor mine,
                         bucket.param_data.Slice(r * shard, (r + 1) * shard));
    if (!gather_input_[b].defined()) gather_input_[b] = mine.Clone();
    MCC_RETURN_IF_ERROR(gather_input_[b].CopyFrom(mine));
    param_work_[b] = dp_->AllGather(gather_input_[b], &bucket.param_data);
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

}  // namespace data_parallel
}  // namespace mcc
