#include "parallel/fsdp/fully_sharded_data_parallel.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/comm/all_reduce_coalesced.h"
#include "core/ops/elementwise.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace fsdp {
namespace {

// Elements [off, off + n) of t flattened, sharing its storage.
absl::StatusOr<Tensor> FlatRange(const Tensor& t, int64_t off, int64_t n) {
  MCC_ASSIGN_OR_RETURN(Tensor flat, t.Reshape({t.numel()}));
  return flat.Slice(off, off + n);
}

// Converts n elements of src (from element src_off) into dst (at dst_off),
// on the tensors' device.
absl::Status ConvertRange(const Tensor& src, int64_t src_off, const Tensor& dst,
                          int64_t dst_off, int64_t n) {
  MCC_ASSIGN_OR_RETURN(Tensor from, FlatRange(src, src_off, n));
  MCC_ASSIGN_OR_RETURN(Tensor to, FlatRange(dst, dst_off, n));
  return ops::Convert(from, &to);
}

// Keeps a step's unit order bounded when no step boundary comes (an
// evaluation-only loop).
constexpr size_t kMaxRecordedRequests = 1 << 20;

// DrainReductions: take only the finished ones.
constexpr size_t kAnyPending = ~size_t{0};

int SizeOf(const comm::ProcessGroup* g) { return g == nullptr ? 1 : g->size(); }
int RankIn(const comm::ProcessGroup* g) { return g == nullptr ? 0 : g->rank(); }

}  // namespace

absl::StatusOr<std::unique_ptr<FullyShardedDataParallel>>
FullyShardedDataParallel::Create(const ParameterList& params,
                                 const std::vector<ParameterList>& units,
                                 comm::ProcessGroup* dp, comm::ProcessGroup* tp,
                                 FsdpConfig config) {
  if (params.empty()) {
    return absl::InvalidArgumentError("FSDP: no parameters");
  }
  for (const auto& p : params) {
    if (p == nullptr || !p->expert_parallel) continue;
    // Expert weights shard over the expert-data-parallel group.
    if (config.ddp.expert_data == nullptr && dp != nullptr && dp->size() > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FSDP: parameter '", p->name,
          "' is an expert weight (expert_parallel) but no expert-data-parallel "
          "group was given (DdpConfig::expert_data)"));
    }
    MCC_RETURN_IF_ERROR(data_parallel::CheckExpertHybridSharding(
        config.ddp.hybrid, config.ddp.expert_data));
    break;
  }
  if (!ShardsGradients(config.strategy)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FSDP: strategy ", ShardingStrategyName(config.strategy),
        " does not shard; it is data_parallel::DistributedDataParallel's "
        "(training::WrapDataParallel picks it)"));
  }
  if (config.max_prefetched_units < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FSDP: max_prefetched_units ", config.max_prefetched_units,
                     " must be >= 0"));
  }
  auto f =
      std::unique_ptr<FullyShardedDataParallel>(new FullyShardedDataParallel);
  f->config_ = config;
  MCC_RETURN_IF_ERROR(data_parallel::CheckHybridSharding(
      config.ddp.hybrid, dp, /*shards_state=*/true));
  f->dp_ = dp;
  f->shard_ = config.ddp.hybrid.ShardGroup(dp);
  f->cross_ =
      config.ddp.hybrid.enabled() ? config.ddp.hybrid.cross_instance : nullptr;
  // Under HSDP the experts' instance and across.
  f->expert_ = config.ddp.hybrid.ExpertShardGroup(config.ddp.expert_data);
  f->expert_cross_ = config.ddp.hybrid.ExpertCrossGroup();
  f->tp_ = tp != nullptr && tp->size() > 1 ? tp : nullptr;
  f->params_ = params;
  f->dtype_ = params[0] ? params[0]->value.dtype() : DType::kFloat32;
  f->device_ = params[0] ? params[0]->value.device() : Device::CPU();

  // Every parameter in exactly one unit.
  std::unordered_map<const Parameter*, int> unit_of;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const auto& p : units[u]) {
      if (p == nullptr || !p->value.defined()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "FSDP: unit ", u, " holds a null parameter or one without value"));
      }
      if (!unit_of.emplace(p.get(), static_cast<int>(u)).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("FSDP: parameter '", p->name, "' is in units ",
                         unit_of[p.get()], " and ", u));
      }
      if (p->value.dtype() != f->dtype_ || p->value.device() != f->device_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "FSDP: parameter '", p->name, "' is ", p->value.Describe(),
            "; all must be ", DTypeName(f->dtype_), " tensors on ",
            f->device_.ToString()));
      }
    }
  }
  for (const auto& p : params) {
    if (p == nullptr || unit_of.count(p.get()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FSDP: parameter '", p ? p->name : "null", "' is in no unit"));
    }
  }
  if (unit_of.size() != params.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FSDP: the units hold ", unit_of.size(),
                     " parameters, the model ", params.size()));
  }

  for (const ParameterList& unit_params : units) {
    Unit unit;
    const int index = static_cast<int>(f->units_.size());
    ParameterList dense, experts;
    for (const auto& p : unit_params) {
      (p->expert_parallel ? experts : dense).push_back(p);
    }
    for (const bool expert : {false, true}) {
      const ParameterList& list = expert ? experts : dense;
      if (expert && list.empty()) continue;
      Part part;
      part.expert = expert;
      comm::ProcessGroup* group = f->ShardGroupOf(part);
      MCC_ASSIGN_OR_RETURN(
          part.layout,
          data_parallel::FlatLayout::Create(
              list, SizeOf(group),
              absl::StrCat("FSDP unit ", index, expert ? " experts" : "")));
      part.pieces = part.layout.Pieces(RankIn(group));
      const int64_t shard = part.layout.shard_numel();
      part.main_shard = Tensor::Zeros({shard}, DType::kFloat32, f->device_);
      part.grad_shard = Tensor::Zeros({shard}, DType::kFloat32, f->device_);
      for (const auto& piece : part.pieces) {
        MCC_RETURN_IF_ERROR(ConvertRange(
            part.layout.params[piece.param]->value, piece.begin,
            part.main_shard, piece.shard_offset, piece.end - piece.begin));
      }
      if (config.strategy == ShardingStrategy::kOptimGrads) {
        // Whole parameters stay, as views of one flat buffer the updated
        // shards are gathered into.
        part.full =
            Tensor::Zeros({part.layout.padded_numel}, f->dtype_, f->device_);
        for (size_t i = 0; i < part.layout.params.size(); ++i) {
          const Tensor& v = part.layout.params[i]->value;
          MCC_RETURN_IF_ERROR(
              ConvertRange(v, 0, part.full, part.layout.offsets[i], v.numel()));
        }
      }
      for (const auto& p : part.layout.params) {
        // Dropped here; bound to unit buffers while the unit computes.
        p->main_grad = Tensor();
        if (config.strategy == ShardingStrategy::kOptimGradsParams) {
          p->value = Tensor();
        }
      }
      unit.parts.push_back(std::move(part));
    }
    unit.resident = config.strategy == ShardingStrategy::kOptimGrads;
    f->units_.push_back(std::move(unit));
  }
  for (int u = 0; u < f->num_units(); ++u) {
    if (f->units_[u].resident) f->BindValues(u);
  }
  VLOG(1) << "FSDP " << ShardingStrategyName(config.strategy) << ": "
          << f->num_units() << " units over DP " << SizeOf(f->shard_);
  return f;
}

absl::StatusOr<std::unique_ptr<FullyShardedDataParallel>>
FullyShardedDataParallel::Wrap(parallel::Model* model, comm::ProcessGroup* dp,
                               FsdpConfig config) {
  return Wrap(std::vector<parallel::Model*>{model}, dp, config);
}

absl::StatusOr<std::unique_ptr<FullyShardedDataParallel>>
FullyShardedDataParallel::Wrap(const std::vector<parallel::Model*>& models,
                               comm::ProcessGroup* dp, FsdpConfig config) {
  if (models.empty()) return absl::InvalidArgumentError("FSDP: no models");
  ParameterList params;
  std::vector<ParameterList> units;
  std::vector<int> offsets;
  for (size_t i = 0; i < models.size(); ++i) {
    if (models[i] == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("FSDP: model chunk ", i, " is null"));
    }
    offsets.push_back(static_cast<int>(units.size()));
    const ParameterList& p = models[i]->parameters();
    params.insert(params.end(), p.begin(), p.end());
    const std::vector<ParameterList>& u = models[i]->units();
    units.insert(units.end(), u.begin(), u.end());
  }
  MCC_ASSIGN_OR_RETURN(
      auto f, Create(params, units, dp, models[0]->tensor_group(), config));
  for (size_t i = 0; i < models.size(); ++i) {
    auto hooks = std::make_unique<ChunkHooks>(f.get(), offsets[i]);
    MCC_RETURN_IF_ERROR(models[i]->AddUnitHooks(hooks.get()));
    f->models_.push_back(models[i]);
    f->chunk_hooks_.push_back(std::move(hooks));
  }
  return f;
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (size_t i = 0; i < models_.size(); ++i) {
    models_[i]->RemoveUnitHooks(chunk_hooks_[i].get());
  }
  for (Unit& u : units_) {
    for (Part& part : u.parts) {
      if (part.gather) part.gather->Wait().IgnoreError();
    }
  }
  for (PendingReduce& p : pending_) p.work->Wait().IgnoreError();
}

absl::StatusOr<std::unique_ptr<optim::Optimizer>>
FullyShardedDataParallel::CreateOptimizer(
    const optim::OptimizerConfig& config,
    const optim::OptimizerGroups& groups) {
  optim::OptimizerPieces shards;
  for (Unit& unit : units_) {
    for (Part& part : unit.parts) {
      shards.expert_params |= part.expert;
      for (const auto& piece : part.pieces) {
        optim::ExternalShard s;
        s.param = part.layout.params[piece.param];
        s.begin = piece.begin;
        s.end = piece.end;
        s.param_shape = part.layout.shapes[piece.param];
        const int64_t lo = piece.shard_offset,
                      hi = lo + piece.end - piece.begin;
        MCC_ASSIGN_OR_RETURN(s.value, part.main_shard.Slice(lo, hi));
        MCC_ASSIGN_OR_RETURN(s.grad, part.grad_shard.Slice(lo, hi));
        shards.pieces.push_back(std::move(s));
      }
    }
  }
  shards.sharded = true;
  shards.shard_group = shard_;
  // Expert pieces: their norms sum over the expert-data group.
  shards.expert_shard_group = expert_;
  shards.device = device_;
  shards.after_update = [this] { return AfterOptimizerStep(); };
  return optim::Optimizer::CreateForPieces(std::move(shards), config, groups);
}

void FullyShardedDataParallel::Trace(FsdpEvent::Kind kind, int unit,
                                     bool prefetch, bool ready) {
  if (!config_.record_trace) return;
  trace_.push_back(FsdpEvent{kind, unit, absl::Now(), prefetch, ready,
                             GetAllocator(device_)->Stats().current_bytes});
}

int FullyShardedDataParallel::ResidentUnits() const {
  if (!shards_params()) return 0;
  int n = 0;
  for (const Unit& u : units_) n += u.resident;
  return n;
}

int FullyShardedDataParallel::IdleResidentUnits() const {
  if (!shards_params()) return 0;
  int n = 0;
  for (const Unit& u : units_) n += u.resident && u.open == 0;
  return n;
}

void FullyShardedDataParallel::ResetStats() {
  stats_ = FsdpStats();
  stats_.gathered_units = stats_.peak_gathered_units = ResidentUnits();
}

void FullyShardedDataParallel::BindValues(int u) {
  for (Part& part : units_[u].parts) {
    for (size_t i = 0; i < part.layout.params.size(); ++i) {
      const int64_t off = part.layout.offsets[i];
      const Shape& shape = part.layout.shapes[i];
      Tensor v = *part.full.Slice(off, off + NumElements(shape));
      part.layout.params[i]->value = *v.Reshape(shape);
    }
  }
}

absl::Status FullyShardedDataParallel::CheckUnit(int unit,
                                                 const char* hook) const {
  if (unit < 0 || unit >= num_units()) {
    return absl::OutOfRangeError(absl::StrCat(
        "FSDP ", hook, "(", unit, "): the model has ", num_units(), " units"));
  }
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::LaunchGather(int u, bool prefetch) {
  Unit& unit = units_[u];
  MCC_RETURN_IF_ERROR(WaitGather(u));
  for (Part& part : unit.parts) {
    const int64_t shard = part.layout.shard_numel();
    if (dtype_ == DType::kFloat32) {
      part.send = part.main_shard;
    } else {
      // Gathered in the model dtype: half the bytes moved and held.
      part.send = Tensor::Empty({shard}, dtype_, device_);
      MCC_RETURN_IF_ERROR(ops::Convert(part.main_shard, &part.send));
    }
    if (!part.full.defined()) {
      part.full = Tensor::Empty({part.layout.padded_numel}, dtype_, device_);
    }
    comm::ProcessGroup* group = ShardGroupOf(part);
    if (SizeOf(group) == 1) {
      MCC_RETURN_IF_ERROR(part.full.CopyFrom(part.send));
      part.send = Tensor();
    } else {
      part.gather = group->AllGather(part.send, &part.full);
    }
  }
  const bool was_resident = unit.resident;
  unit.resident = true;
  if (!was_resident) BindValues(u);
  ++stats_.gathers;
  if (prefetch) ++stats_.prefetched_gathers;
  stats_.gathered_units = ResidentUnits();
  stats_.peak_gathered_units =
      std::max(stats_.peak_gathered_units, stats_.gathered_units);
  Trace(FsdpEvent::kGatherLaunched, u, prefetch);
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::WaitGather(int u) {
  Unit& unit = units_[u];
  bool any = false, ready = true;
  for (const Part& part : unit.parts) {
    if (!part.gather) continue;
    any = true;
    ready = ready && part.gather->IsCompleted();
  }
  if (!any) return absl::OkStatus();
  stats_.gathers_ready_on_use += ready;
  absl::Status status;
  for (Part& part : unit.parts) {
    if (!part.gather) continue;
    absl::Status s = part.gather->Wait();
    part.gather.reset();
    part.send = Tensor();
    if (!s.ok() && status.ok()) {
      status = absl::Status(
          s.code(), absl::StrCat("FSDP parameter all-gather of unit ", u,
                                 part.expert ? " (experts)" : "",
                                 " on DP rank ", dp_rank(), ": ", s.message()));
    }
  }
  Trace(FsdpEvent::kGatherDone, u, false, ready);
  return status;
}

absl::Status FullyShardedDataParallel::Release(int u) {
  Unit& unit = units_[u];
  if (!shards_params() || pinned_ || !unit.resident || unit.open > 0) {
    return absl::OkStatus();
  }
  MCC_RETURN_IF_ERROR(WaitGather(u));
  for (Part& part : unit.parts) {
    for (const auto& p : part.layout.params) p->value = Tensor();
    part.full = Tensor();
  }
  unit.resident = false;
  stats_.gathered_units = ResidentUnits();
  Trace(FsdpEvent::kReleased, u);
  return absl::OkStatus();
}

int FullyShardedDataParallel::NextUnit(int64_t k, const Request& now) const {
  if (order_valid_) {
    return k + 1 < static_cast<int64_t>(order_.size()) ? order_[k + 1].unit
                                                       : -1;
  }
  // No order known yet (the first step): the neighbour in the pass's
  // direction, unless this unit runs nested inside another (a tied head).
  for (int v = 0; v < num_units(); ++v) {
    if (v != now.unit && units_[v].open > 0) return -1;
  }
  if (!now.backward) {
    // After the last unit's forward comes its backward.
    return now.unit + 1 < num_units() ? now.unit + 1 : now.unit;
  }
  return now.unit - 1;
}

absl::Status FullyShardedDataParallel::Open(int u, bool backward) {
  MCC_RETURN_IF_ERROR(
      CheckUnit(u, backward ? "BeforeBackward" : "BeforeForward"));
  Trace(backward ? FsdpEvent::kBackwardBegin : FsdpEvent::kForwardBegin, u);
  const Request req{u, backward};
  const int64_t k = request_index_++;
  if (recording_.size() < kMaxRecordedRequests) recording_.push_back(req);
  if (order_valid_ &&
      (k >= static_cast<int64_t>(order_.size()) || !(order_[k] == req))) {
    order_valid_ = false;  // This step departs from the last one's order.
  }
  Unit& unit = units_[u];
  if (shards_params() && !unit.resident) {
    MCC_RETURN_IF_ERROR(LaunchGather(u, /*prefetch=*/false));
  }
  MCC_RETURN_IF_ERROR(WaitGather(u));
  ++unit.open;
  if (backward && unit.open_backward > 0) ++stats_.split_backward_opens;
  if (backward && unit.open_backward++ == 0) {
    // At most one earlier unit's full gradient stays in flight, so
    // gradient memory is 1/DP plus two units.
    // (Its parts' reductions: the dense one and the experts'.)
    MCC_RETURN_IF_ERROR(DrainReductions(PendingOfLastUnit()));
    for (Part& part : unit.parts) {
      part.full_grad =
          Tensor::Zeros({part.layout.padded_numel}, DType::kFloat32, device_);
      for (size_t i = 0; i < part.layout.params.size(); ++i) {
        const int64_t off = part.layout.offsets[i];
        const Shape& shape = part.layout.shapes[i];
        MCC_ASSIGN_OR_RETURN(
            Tensor g, part.full_grad.Slice(off, off + NumElements(shape)));
        MCC_ASSIGN_OR_RETURN(part.layout.params[i]->main_grad,
                             g.Reshape(shape));
      }
    }
  }
  expected_next_ = NextUnit(k, req);
  if (shards_params()) {
    // Units gathered for an order that did not come are freed first.
    for (int v = 0; v < num_units(); ++v) {
      if (v != u && v != expected_next_) MCC_RETURN_IF_ERROR(Release(v));
    }
    const int next = expected_next_;
    if (config_.prefetch && next >= 0 && !units_[next].resident &&
        IdleResidentUnits() < config_.max_prefetched_units) {
      MCC_RETURN_IF_ERROR(LaunchGather(next, /*prefetch=*/true));
    }
  }
  return DrainReductions(kAnyPending);
}

absl::Status FullyShardedDataParallel::Close(int u, bool backward) {
  const char* hook = backward ? "AfterBackward" : "AfterForward";
  MCC_RETURN_IF_ERROR(CheckUnit(u, hook));
  Unit& unit = units_[u];
  if (unit.open == 0 || (backward && unit.open_backward == 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("FSDP ", hook, "(", u, ") without its ",
                     backward ? "BeforeBackward" : "BeforeForward"));
  }
  --unit.open;
  Trace(backward ? FsdpEvent::kBackwardEnd : FsdpEvent::kForwardEnd, u);
  if (backward && --unit.open_backward == 0) {
    MCC_RETURN_IF_ERROR(LaunchReduceScatter(u));
  }
  // Kept when the recorded order says this unit comes next (the last
  // layer's forward, then its backward).
  if (unit.open == 0 && u != expected_next_) MCC_RETURN_IF_ERROR(Release(u));
  return DrainReductions(kAnyPending);
}

absl::Status FullyShardedDataParallel::BeforeForward(int unit) {
  return Open(unit, false);
}
absl::Status FullyShardedDataParallel::AfterForward(int unit) {
  return Close(unit, false);
}
absl::Status FullyShardedDataParallel::BeforeBackward(int unit) {
  return Open(unit, true);
}
absl::Status FullyShardedDataParallel::AfterBackward(int unit) {
  return Close(unit, true);
}

absl::Status FullyShardedDataParallel::LaunchReduceScatter(int u) {
  Unit& unit = units_[u];
  const int n = dp_size();
  for (size_t k = 0; k < unit.parts.size(); ++k) {
    Part& part = unit.parts[k];
    PendingReduce pr;
    pr.unit = u;
    pr.part = static_cast<int>(k);
    pr.in = std::move(part.full_grad);
    part.full_grad = Tensor();
    for (const auto& p : part.layout.params) p->main_grad = Tensor();
    comm::ProcessGroup* group = ShardGroupOf(part);
    comm::ReduceOp op = comm::ReduceOp::kAvg;
    // Under HSDP the instance's average is not DP's, nor for the experts
    // the expert-data group's: scale by 1/DP, then sum.
    if (n > 1 && (!config_.ddp.average_in_collective || cross_ != nullptr ||
                  part.expert)) {
      op = comm::ReduceOp::kSum;
      MCC_ASSIGN_OR_RETURN(Tensor used, pr.in.Slice(0, part.layout.numel));
      MCC_RETURN_IF_ERROR(
          ops::Scale(used, 1.0f / static_cast<float>(n), &used));
    }
    if (SizeOf(group) == 1) {
      // DP 1, HSDP with one rank per instance, or experts held by this
      // rank alone.
      pr.out = pr.in;
      pr.work = comm::Work::Done(absl::OkStatus());
    } else {
      pr.out =
          Tensor::Empty({part.layout.shard_numel()}, DType::kFloat32, device_);
      pr.work = group->ReduceScatter(pr.in, &pr.out, op);
    }
    pending_.push_back(std::move(pr));
  }
  ++stats_.reduce_scatters;
  Trace(FsdpEvent::kReduceScatterLaunched, u);
  return absl::OkStatus();
}

size_t FullyShardedDataParallel::PendingOfLastUnit() const {
  size_t n = 0;
  for (auto it = pending_.rbegin();
       it != pending_.rend() && it->unit == pending_.back().unit; ++it) {
    ++n;
  }
  return std::max<size_t>(n, 1);
}

absl::Status FullyShardedDataParallel::DrainReductions(size_t max_pending) {
  while (!pending_.empty()) {
    PendingReduce& pr = pending_.front();
    if (pending_.size() <= max_pending && !pr.work->IsCompleted()) break;
    absl::Status s = pr.work->Wait();
    if (!s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("FSDP gradient reduce-scatter of unit ",
                                 pr.unit, pr.part > 0 ? " (experts)" : "",
                                 " on DP rank ", dp_rank(), ": ", s.message()));
    }
    Tensor& shard = units_[pr.unit].parts[pr.part].grad_shard;
    // pr.out is the whole full-gradient buffer when DP is 1: add its first
    // shard's worth (the same elements).
    Tensor reduced = pr.out;
    if (reduced.numel() != shard.numel()) {
      MCC_ASSIGN_OR_RETURN(reduced, reduced.Slice(0, shard.numel()));
    }
    MCC_RETURN_IF_ERROR(ops::Accumulate(reduced, 1.0f, &shard));
    pending_.pop_front();
  }
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::FinishParamGather() {
  if (!shards_params()) {
    for (int u = 0; u < num_units(); ++u) MCC_RETURN_IF_ERROR(WaitGather(u));
  }
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::BeginStep() {
  MCC_RETURN_IF_ERROR(FinishParamGather());
  ZeroGrads();
  return absl::OkStatus();
}

void FullyShardedDataParallel::ZeroGrads() {
  for (Unit& u : units_) {
    for (Part& part : u.parts) part.grad_shard.Zero();
  }
  // A step starts: record its order, prefetch by the last one's.
  recording_.clear();
  request_index_ = 0;
  order_valid_ = !order_.empty();
}

absl::Status FullyShardedDataParallel::FinishGradSync() {
  for (int u = 0; u < num_units(); ++u) {
    if (units_[u].open > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("FSDP FinishGradSync: unit ", u,
                       " is still open (a Before* hook without its After*)"));
    }
  }
  MCC_RETURN_IF_ERROR(DrainReductions(0));
  MCC_RETURN_IF_ERROR(ReduceAcrossInstances());
  // The optimizer changes the shards: no gathered copy stays valid.
  for (int u = 0; u < num_units(); ++u) MCC_RETURN_IF_ERROR(Release(u));
  if (!recording_.empty()) order_ = recording_;
  recording_.clear();
  order_valid_ = false;
  expected_next_ = -1;
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::ReduceAcrossInstances() {
  if (cross_ == nullptr && expert_cross_ == nullptr) return absl::OkStatus();
  // Once per step, after every micro-batch's reduce-scatter has landed, in
  // unit order on every rank: a sum is linear, so the accumulated shard
  // sums as well as each micro-batch's would, and no rank can meet these
  // collectives in another order than its peers (backward drains
  // reduce-scatters as they complete, which differs by rank).
  std::vector<std::pair<int, std::shared_ptr<comm::Work>>> work;
  for (int u = 0; u < num_units(); ++u) {
    for (Part& part : units_[u].parts) {
      comm::ProcessGroup* cross = CrossGroupOf(part);
      if (cross == nullptr || cross->size() == 1) continue;
      work.emplace_back(
          u, cross->AllReduce(&part.grad_shard, comm::ReduceOp::kSum));
    }
  }
  absl::Status status;
  for (auto& [u, w] : work) {
    absl::Status s = w->Wait();
    if (!s.ok() && status.ok()) {
      status = absl::Status(
          s.code(), absl::StrCat("FSDP cross-instance gradient all-reduce of "
                                 "unit ",
                                 u, ": ", s.message()));
    }
  }
  return status;
}

absl::Status FullyShardedDataParallel::SyncSharedGradients(
    comm::ProcessGroup* embedding_group) {
  const bool across_stages =
      embedding_group != nullptr && embedding_group->size() > 1;
  // Each copy's whole gradient with its (shard view, whole range) pairs;
  // copies of one name on this rank (ZB-V holds both on stage 0) are
  // summed here, in unit order, before the sum across stages.
  struct Copy {
    std::string name;
    Tensor whole;
    std::vector<std::pair<Tensor, Tensor>> mine;
  };
  std::vector<Copy> copies;
  std::map<std::string, int> count;
  // Expert weights are never shared across stages: dense parts only.
  for (Unit& u : units_) {
    for (const auto& p : u.parts[0].layout.params) {
      if (p->shared_with_other_stage) ++count[p->name];
    }
  }
  bool local_pairs = false;
  for (const auto& [name, n] : count) local_pairs |= n > 1;
  if (!across_stages && !local_pairs) return absl::OkStatus();
  for (Unit& u : units_) {
    Part& unit = u.parts[0];
    for (size_t i = 0; i < unit.layout.params.size(); ++i) {
      const auto& p = unit.layout.params[i];
      if (!p->shared_with_other_stage) continue;
      // The stages' layouts differ, so their pieces do not line up: the
      // whole gradient meets over DP first (zeros outside each piece),
      // then the two copies sum it.
      const int64_t numel = NumElements(unit.layout.shapes[i]);
      Copy copy;
      copy.name = p->name;
      copy.whole = Tensor::Zeros({numel}, DType::kFloat32, device_);
      for (const auto& piece : unit.pieces) {
        if (piece.param != static_cast<int>(i)) continue;
        const int64_t n = piece.end - piece.begin;
        MCC_ASSIGN_OR_RETURN(
            Tensor shard,
            unit.grad_shard.Slice(piece.shard_offset, piece.shard_offset + n));
        MCC_ASSIGN_OR_RETURN(Tensor range,
                             copy.whole.Slice(piece.begin, piece.begin + n));
        MCC_RETURN_IF_ERROR(range.CopyFrom(shard));
        copy.mine.emplace_back(shard, range);
      }
      // The pieces split over the shard group (an instance under HSDP,
      // whose peers across instances hold the same pieces).
      if (SizeOf(shard_) > 1) {
        MCC_RETURN_IF_ERROR(
            shard_->AllReduceSync(&copy.whole, comm::ReduceOp::kSum));
      }
      copies.push_back(std::move(copy));
    }
  }
  for (size_t a = 0; a < copies.size(); ++a) {
    for (size_t b = a + 1; b < copies.size(); ++b) {
      if (copies[b].name != copies[a].name) continue;
      if (copies[b].whole.numel() != copies[a].whole.numel()) {
        return absl::InvalidArgumentError(
            absl::StrCat("FSDP shared gradient of '", copies[a].name,
                         "': this stage's copies differ in size"));
      }
      MCC_RETURN_IF_ERROR(
          ops::Add(copies[a].whole, copies[b].whole, &copies[a].whole));
      MCC_RETURN_IF_ERROR(copies[b].whole.CopyFrom(copies[a].whole));
    }
  }
  std::map<std::string, bool> summed;  // Across stages, once per name.
  for (Copy& copy : copies) {
    if (across_stages) {
      bool& done = summed[copy.name];
      if (!done) {
        absl::Status s =
            embedding_group->AllReduceSync(&copy.whole, comm::ReduceOp::kSum);
        if (!s.ok()) {
          return absl::Status(
              s.code(),
              absl::StrCat("FSDP sum of the shared gradient of '", copy.name,
                           "' over the embedding group: ", s.message()));
        }
        for (Copy& other : copies) {
          if (&other != &copy && other.name == copy.name) {
            MCC_RETURN_IF_ERROR(other.whole.CopyFrom(copy.whole));
          }
        }
        done = true;
      }
    }
  }
  for (Copy& copy : copies) {
    for (auto& [shard, range] : copy.mine) {
      MCC_RETURN_IF_ERROR(shard.CopyFrom(range));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> FullyShardedDataParallel::HeldGradient(
    const Parameter& param) const {
  for (const Unit& u : units_) {
    for (const Part& part : u.parts) {
      for (size_t i = 0; i < part.layout.params.size(); ++i) {
        if (part.layout.params[i].get() != &param) continue;
        // A parameter's pieces in one shard are contiguous there.
        int64_t lo = -1, hi = -1;
        for (const auto& piece : part.pieces) {
          if (piece.param != static_cast<int>(i)) continue;
          if (lo < 0) lo = piece.shard_offset;
          hi = piece.shard_offset + piece.end - piece.begin;
        }
        if (lo < 0) return Tensor::Empty({0}, DType::kFloat32, device_);
        return part.grad_shard.Slice(lo, hi);
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "FSDP HeldGradient: parameter '", param.name, "' is not wrapped here"));
}

absl::Status FullyShardedDataParallel::FinalizeGradients() {
  if (tp_ == nullptr) return absl::OkStatus();
  // The shards' pieces of sequence-parallel parameters, summed over TP in
  // one collective (TP ranks' layouts agree, so the pieces match).
  std::vector<Tensor> pieces;
  for (Unit& u : units_) {
    for (Part& part : u.parts) {
      for (const auto& piece : part.pieces) {
        if (!part.layout.params[piece.param]->sequence_parallel) continue;
        MCC_ASSIGN_OR_RETURN(Tensor view,
                             part.grad_shard.Slice(
                                 piece.shard_offset,
                                 piece.shard_offset + piece.end - piece.begin));
        pieces.push_back(std::move(view));
      }
    }
  }
  std::vector<Tensor*> grads;
  for (Tensor& piece : pieces) grads.push_back(&piece);
  return comm::AllReduceCoalescedSync(tp_, grads, comm::ReduceOp::kSum);
}

absl::Status FullyShardedDataParallel::AfterOptimizerStep() {
  if (config_.strategy == ShardingStrategy::kOptimGrads) {
    // Refresh the whole parameters from the updated shards; the first
    // forward of each unit (or FinishParamGather) waits.
    for (int u = 0; u < num_units(); ++u) {
      MCC_RETURN_IF_ERROR(LaunchGather(u, /*prefetch=*/true));
    }
  } else if (shards_params() && config_.prefetch && !pinned_) {
    const int first = order_.empty() ? 0 : order_[0].unit;
    MCC_RETURN_IF_ERROR(LaunchGather(first, /*prefetch=*/true));
  }
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::GatherFullParams() {
  if (!shards_params()) return FinishParamGather();
  pinned_ = true;
  for (int u = 0; u < num_units(); ++u) {
    if (!units_[u].resident) MCC_RETURN_IF_ERROR(LaunchGather(u, false));
  }
  for (int u = 0; u < num_units(); ++u) MCC_RETURN_IF_ERROR(WaitGather(u));
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::ScatterFullParams() {
  for (Unit& u : units_) {
    for (Part& part : u.parts) {
      for (const auto& piece : part.pieces) {
        const auto& p = part.layout.params[piece.param];
        if (!p->value.defined()) {
          return absl::FailedPreconditionError(
              absl::StrCat("FSDP ScatterFullParams: parameter '", p->name,
                           "' is not gathered (call GatherFullParams first)"));
        }
        MCC_RETURN_IF_ERROR(ConvertRange(p->value, piece.begin, part.main_shard,
                                         piece.shard_offset,
                                         piece.end - piece.begin));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status FullyShardedDataParallel::ReleaseFullParams() {
  if (!shards_params()) return absl::OkStatus();
  pinned_ = false;
  for (int u = 0; u < num_units(); ++u) MCC_RETURN_IF_ERROR(Release(u));
  return absl::OkStatus();
}

std::string FullyShardedDataParallel::Describe() const {
  std::string out =
      absl::StrCat(ShardingStrategyName(config_.strategy), " (",
                   shards_params() ? "ZeRO-3" : "ZeRO-2", "): ", num_units(),
                   " units, gradients reduce-scattered per unit");
  if (shards_params()) {
    absl::StrAppend(&out, ", parameters gathered per unit",
                    config_.prefetch
                        ? absl::StrCat(" with ", config_.max_prefetched_units,
                                       " prefetched")
                        : std::string());
  }
  if (cross_ != nullptr) {
    absl::StrAppend(&out, "; HSDP: ", cross_->size(), " instances of ",
                    SizeOf(shard_), " ranks");
  }
  bool experts = false;
  for (const Unit& u : units_) experts |= u.parts.size() > 1;
  if (experts) {
    absl::StrAppend(&out, "; expert weights sharded over expert DP ",
                    SizeOf(expert_));
  }
  return out;
}

}  // namespace fsdp
}  // namespace mcc
