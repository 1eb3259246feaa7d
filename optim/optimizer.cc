#include "optim/optimizer.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/device_staging.h"
#include "core/ops/elementwise.h"
#include "core/ops/multi_tensor.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "optim/offload_split.h"

namespace mcc {
namespace optim {

bool CountsInGradNorm(const Parameter& p, int tensor_rank, int pipeline_rank) {
  if (p.expert_parallel) return true;
  if (!p.is_tensor_parallel() && tensor_rank != 0) return false;
  if (p.shared_with_other_stage && pipeline_rank != 0) return false;
  if (p.norm_counted_by_other_copy) return false;
  return true;
}

namespace {

int RankOf(const comm::ProcessGroup* g) { return g == nullptr ? 0 : g->rank(); }

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const ParameterList& params, const OptimizerConfig& config,
    const OptimizerGroups& groups) {
  std::vector<ExternalShard> shards;
  for (const auto& p : params) {
    if (p == nullptr || !p->value.defined()) {
      return absl::InvalidArgumentError(
          "optimizer: a parameter is null or has no value");
    }
    ExternalShard s;
    s.param = p;
    s.begin = 0;
    s.end = p->value.numel();
    shards.push_back(s);
  }
  return Build(std::move(shards), /*sharded=*/false, config, groups);
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::CreateForPieces(
    OptimizerPieces pieces, const OptimizerConfig& config,
    const OptimizerGroups& groups) {
  for (const ExternalShard& s : pieces.pieces) {
    if (s.param == nullptr) {
      return absl::InvalidArgumentError("optimizer: a piece has no parameter");
    }
    if (!s.value.defined() && !s.grad.defined()) continue;  // Views param.
    const int64_t n = s.end - s.begin;
    if (!s.value.defined() || !s.grad.defined() ||
        s.value.dtype() != DType::kFloat32 ||
        s.grad.dtype() != DType::kFloat32 || s.value.numel() != n ||
        s.grad.numel() != n || s.begin < 0 ||
        s.end > NumElements(s.param_shape)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: external piece [", s.begin, ", ", s.end, ") of '",
          s.param->name, "' (shape ", ShapeToString(s.param_shape),
          ") needs fp32 value and gradient pieces of that many elements"));
    }
  }
  MCC_ASSIGN_OR_RETURN(auto opt, Build(std::move(pieces.pieces), pieces.sharded,
                                       config, groups));
  if (!opt->device_known_) {
    opt->device_ = pieces.device;
    opt->device_known_ = true;
  }
  opt->shard_group_ = pieces.sharded ? pieces.shard_group : nullptr;
  opt->expert_shard_group_ =
      pieces.sharded ? pieces.expert_shard_group : nullptr;
  opt->expert_params_ = opt->expert_params_ || pieces.expert_params;
  opt->after_update_ = std::move(pieces.after_update);
  return opt;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Build(
    std::vector<ExternalShard> shards, bool sharded,
    const OptimizerConfig& config, const OptimizerGroups& groups) {
  if (!(config.clip_grad >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--clip-grad ", config.clip_grad, " must be >= 0 (0: no clipping)"));
  }
  if (!(config.weight_decay >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--weight-decay ", config.weight_decay, " must be >= 0"));
  }
  auto opt = std::unique_ptr<Optimizer>(new Optimizer);
  opt->config_ = config;
  opt->groups_ = groups;
  opt->sharded_ = sharded;
  switch (config.type) {
    case OptimizerType::kAdam:
      if (!(config.adam_beta1 >= 0 && config.adam_beta1 < 1 &&
            config.adam_beta2 >= 0 && config.adam_beta2 < 1 &&
            config.adam_eps > 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--adam-beta1 ", config.adam_beta1, " and --adam-beta2 ",
            config.adam_beta2, " must lie in [0, 1), --adam-eps ",
            config.adam_eps, " must be positive"));
      }
      opt->rule_ = MakeAdamW(static_cast<float>(config.adam_beta1),
                             static_cast<float>(config.adam_beta2),
                             static_cast<float>(config.adam_eps));
      break;
    case OptimizerType::kSgd:
      if (!(config.sgd_momentum >= 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--sgd-momentum ", config.sgd_momentum, " must be >= 0"));
      }
      opt->rule_ = MakeSgd(static_cast<float>(config.sgd_momentum));
      break;
  }
  const StatePrecision& precision = config.state_precision;
  if (precision.lowered() && config.type != OptimizerType::kAdam) {
    return absl::InvalidArgumentError(
        "--use-precision-aware-optimizer: lower-precision state (" +
        DescribeStatePrecision(precision) + ") needs --optimizer adam");
  }
  if (config.loss_scaling) {
    MCC_ASSIGN_OR_RETURN(LossScaler scaler,
                         LossScaler::Create(config.loss_scaler));
    opt->scaler_ = scaler;
  }
  const int tp_rank = RankOf(groups.tensor);
  const int pp_rank = RankOf(groups.pipeline);
  const std::vector<std::string> names = opt->rule_->StateNames();
  std::vector<int64_t> sizes;
  for (const auto& s : shards) sizes.push_back(s.end - s.begin);
  MCC_ASSIGN_OR_RETURN(const std::vector<bool> offload,
                       SplitForOffload(sizes, config.cpu_offload_fraction));
  // Each range moves to the host as soon as it is made, so the device holds
  // at most one offloaded range's state at a time.
  auto finish = [&](Range r, size_t index) -> absl::Status {
    if (offload[index]) MCC_RETURN_IF_ERROR(opt->Offload(&r));
    opt->ranges_.push_back(std::move(r));
    return absl::OkStatus();
  };
  for (size_t index = 0; index < shards.size(); ++index) {
    const ExternalShard& s = shards[index];
    Range r;
    r.param = s.param;
    r.begin = s.begin;
    r.end = s.end;
    if (s.value.defined()) {
      // Held outside the parameter: the fp32 piece is the main copy.
      r.master = s.value;
      r.grad = s.grad;
      r.shape = s.param_shape;
      MCC_RETURN_IF_ERROR(opt->CheckDevice(*s.param, s.value));
      MCC_RETURN_IF_ERROR(opt->CheckDevice(*s.param, s.grad));
      if (precision.main_params != DType::kFloat32) {
        // The wrapper's fp32 shard is the main copy; it is not ours to lower.
        return absl::InvalidArgumentError(absl::StrCat(
            "--main-params-dtype ", DTypeName(precision.main_params),
            ": the main copy of '", s.param->name,
            "' is the data-parallel wrapper's fp32 shard (ZeRO-2/3); lower "
            "only the moments there (--exp-avg-dtype, --exp-avg-sq-dtype)"));
      }
      for (size_t i = 0; i < names.size(); ++i) {
        r.state.push_back(Tensor::Zeros({r.end - r.begin},
                                        precision.Of(names[i]), opt->device_));
      }
      r.counted = CountsInGradNorm(*s.param, tp_rank, pp_rank);
      r.expert = s.param->expert_parallel;
      opt->expert_params_ = opt->expert_params_ || r.expert;
      MCC_RETURN_IF_ERROR(finish(std::move(r), index));
      continue;
    }
    const Tensor& value = s.param->value;
    r.shape = value.shape();
    if (!IsFloatingPoint(value.dtype()) || s.begin < 0 ||
        s.end > value.numel() || s.begin >= s.end) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: parameter '", s.param->name, "' ",
                       value.Describe(), " with range [", s.begin, ", ", s.end,
                       ") is not a floating-point tensor piece"));
    }
    if (!s.param->main_grad.defined() ||
        s.param->main_grad.dtype() != DType::kFloat32 ||
        s.param->main_grad.numel() != value.numel() ||
        s.param->main_grad.device() != value.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer: parameter '", s.param->name, "' main_grad ",
          s.param->main_grad.defined() ? s.param->main_grad.Describe()
                                       : "undefined",
          " must be fp32 shaped as ", value.Describe(), " on its device"));
    }
    MCC_RETURN_IF_ERROR(opt->CheckDevice(*s.param, value));
    MCC_ASSIGN_OR_RETURN(Tensor model, opt->View(value, r));
    if (value.dtype() == DType::kFloat32) {
      // The parameter is its own main copy (whatever --main-params-dtype).
      r.master = model;
    } else {
      MCC_ASSIGN_OR_RETURN(r.master, model.To(precision.main_params));
      r.own_master = true;
    }
    for (size_t i = 0; i < names.size(); ++i) {
      r.state.push_back(Tensor::Zeros({r.end - r.begin}, precision.Of(names[i]),
                                      opt->device_));
    }
    r.counted = CountsInGradNorm(*s.param, tp_rank, pp_rank);
    r.expert = s.param->expert_parallel;
    opt->expert_params_ = opt->expert_params_ || r.expert;
    MCC_RETURN_IF_ERROR(finish(std::move(r), index));
  }
  if (opt->offloaded_elements() > 0) {
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    LOG(INFO) << "optimizer: --optimizer-cpu-offload keeps "
              << opt->offloaded_elements() << " of the " << total
              << " elements it updates (" << opt->offloaded_state_bytes()
              << " bytes of main weights and state) in host memory";
  }
  return opt;
}

absl::Status Optimizer::Offload(Range* r) {
  if (device_.is_cpu()) {
    return absl::InvalidArgumentError(
        "--optimizer-cpu-offload on the CPU device: the optimizer state "
        "already lives in host memory, so offloading it is meaningless");
  }
  if (side_ == nullptr) {
    MCC_ASSIGN_OR_RETURN(side_, SideStream::Create(device_));
  }
  const int64_t n = r->end - r->begin;
  const Device device = device_;
  auto pinned = [&](DType dtype) -> absl::StatusOr<Tensor> {
    const size_t bytes = static_cast<size_t>(n) * DTypeSize(dtype);
    void* data = AllocatePinnedHost(device, bytes);
    if (data == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("--optimizer-cpu-offload: no pinned host memory for ",
                       bytes, " bytes of '", r->param->name, "'"));
    }
    std::shared_ptr<void> owner(
        data, [device](void* p) { FreePinnedHost(device, p); });
    return Tensor::FromExternal(data, {n}, dtype, Device::CPU(),
                                std::move(owner));
  };
  auto to_host = [&](const Tensor& t) -> absl::StatusOr<Tensor> {
    MCC_ASSIGN_OR_RETURN(Tensor host, pinned(t.dtype()));
    MCC_RETURN_IF_ERROR(host.CopyFrom(t));
    return host;
  };
  // External pieces: the wrapper's fp32 shard is what the device keeps.
  if (r->grad.defined()) {
    r->device_model = r->master;
  } else {
    MCC_ASSIGN_OR_RETURN(r->device_model, View(r->param->value, *r));
  }
  MCC_ASSIGN_OR_RETURN(r->master, to_host(r->master));
  r->own_master = true;
  for (Tensor& t : r->state) {
    MCC_ASSIGN_OR_RETURN(t, to_host(t));
  }
  MCC_ASSIGN_OR_RETURN(r->host_grad, pinned(DType::kFloat32));
  if (r->device_model.dtype() == DType::kFloat32) {
    // fp32 weights are their own main copy (never lowered).
    r->host_model = r->master;
  } else {
    MCC_ASSIGN_OR_RETURN(r->host_model, pinned(r->device_model.dtype()));
  }
  r->offloaded = true;
  return absl::OkStatus();
}

absl::StatusOr<DeviceEvent> Optimizer::FetchOffloadedGrads() {
  // After the gradients' reductions on the current stream.
  MCC_RETURN_IF_ERROR(side_->WaitForCurrentStream());
  for (Range& r : ranges_) {
    if (!r.offloaded) continue;
    MCC_ASSIGN_OR_RETURN(Tensor g, GradOf(r));
    MCC_RETURN_IF_ERROR(
        side_->CopyToHost(r.host_grad.raw_data(), g.raw_data(), g.nbytes()));
  }
  return side_->Record();
}

absl::Status Optimizer::StepOffloaded(const UpdateHyper& base,
                                      const DeviceEvent& grads_on_host) {
  MCC_RETURN_IF_ERROR(grads_on_host.Synchronize());
  for (Range& r : ranges_) {
    if (!r.offloaded) continue;
    MCC_RETURN_IF_ERROR(UpdateRange(
        base, r.host_grad, &r,
        r.device_model.dtype() == DType::kFloat32 ? nullptr : &r.host_model));
    MCC_RETURN_IF_ERROR(side_->CopyToDevice(r.device_model.raw_data(),
                                            r.host_model.raw_data(),
                                            r.host_model.nbytes()));
  }
  MCC_ASSIGN_OR_RETURN(DeviceEvent written, side_->Record());
  // Later work on the current stream (the gather of updated parameters,
  // the next forward) reads the written weights.
  return written.WaitOnCurrentStream();
}

absl::StatusOr<Tensor> Optimizer::View(const Tensor& t, const Range& r) const {
  MCC_ASSIGN_OR_RETURN(Tensor flat, t.Reshape({t.numel()}));
  return flat.Slice(r.begin, r.end);
}

absl::StatusOr<Tensor> Optimizer::GradOf(const Range& r) const {
  if (r.grad.defined()) return r.grad;
  return View(r.param->main_grad, r);
}

double Optimizer::loss_scale() const {
  return scaler_ ? scaler_->scale() : 1.0;
}

absl::Status Optimizer::ReduceSum(Tensor* t) {
  if (sharded_ && shard_group_ != nullptr && shard_group_->size() > 1) {
    MCC_RETURN_IF_ERROR(shard_group_->AllReduceSync(t, comm::ReduceOp::kSum));
  }
  comm::ProcessGroup* mp = groups_.model ? groups_.model : groups_.tensor;
  if (mp != nullptr && mp->size() > 1) {
    MCC_RETURN_IF_ERROR(mp->AllReduceSync(t, comm::ReduceOp::kSum));
  }
  return absl::OkStatus();
}

absl::Status Optimizer::ReduceStats(Tensor* dense, Tensor* expert) {
  if (expert == nullptr) return ReduceSum(dense);
  auto sum_over = [](comm::ProcessGroup* g, Tensor* t) -> absl::Status {
    if (g == nullptr || g->size() == 1) return absl::OkStatus();
    return g->AllReduceSync(t, comm::ReduceOp::kSum);
  };
  if (sharded_) {
    MCC_RETURN_IF_ERROR(sum_over(shard_group_, dense));
    MCC_RETURN_IF_ERROR(sum_over(expert_shard_group_, expert));
  }
  // The stage's experts, each shard once; the same on every rank of the
  // stage, so joined on one TP rank before the model-parallel sum.
  MCC_RETURN_IF_ERROR(sum_over(groups_.expert_tensor_model, expert));
  if (RankOf(groups_.tensor) == 0) {
    MCC_RETURN_IF_ERROR(ops::Add(*dense, *expert, dense));
  }
  comm::ProcessGroup* mp = groups_.model ? groups_.model : groups_.tensor;
  return sum_over(mp, dense);
}

absl::Status Optimizer::CheckDevice(const Parameter& p, const Tensor& t) {
  if (!device_known_) {
    device_ = t.device();
    device_known_ = true;
  }
  if (t.device() != device_) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: parameter '", p.name, "' has ", t.Describe(),
                     ", but the other pieces live on ", device_.ToString(),
                     " (one optimizer serves one device)"));
  }
  return absl::OkStatus();
}

absl::Status Optimizer::ComputeGradStats(Tensor* stats) {
  if (stats == nullptr || !stats->defined() ||
      stats->dtype() != DType::kFloat32 || stats->numel() != 4 ||
      stats->device() != device_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: gradient statistics go to an fp32 [4] tensor on ",
        device_.ToString(), ", not ",
        stats && stats->defined() ? stats->Describe() : "an undefined one"));
  }
  std::vector<Tensor> counted, checked, expert;
  for (const Range& r : ranges_) {
    MCC_ASSIGN_OR_RETURN(Tensor g, GradOf(r));
    (r.expert ? expert : r.counted ? counted : checked).push_back(std::move(g));
  }
  ops::SumOfSquaresOptions options;
  options.scale = 1.0 / loss_scale();
  options.count_zeros = config_.log_num_zeros_in_grad;
  MCC_RETURN_IF_ERROR(
      ops::MultiTensorSumOfSquares(counted, checked, options, stats));
  if (!has_expert()) return ReduceSum(stats);
  Tensor expert_stats = Tensor::Empty({4}, DType::kFloat32, device_);
  MCC_RETURN_IF_ERROR(
      ops::MultiTensorSumOfSquares(expert, {}, options, &expert_stats));
  return ReduceStats(stats, &expert_stats);
}

absl::Status Optimizer::AddHostSumOfSquares(const std::vector<Tensor>& host,
                                            Tensor* stats) {
  if (host.empty()) return absl::OkStatus();
  // As a float64 sum split again into two fp32 halves.
  Tensor host_stats = Tensor::Empty({4}, DType::kFloat32);
  MCC_RETURN_IF_ERROR(ops::MultiTensorSumOfSquares(
      host, {}, ops::SumOfSquaresOptions(), &host_stats));
  MCC_ASSIGN_OR_RETURN(Tensor device_part, stats->To(Device::CPU()));
  const std::vector<float> a = device_part.ToFloats();
  const std::vector<float> b = host_stats.ToFloats();
  const double sum = static_cast<double>(a[0]) + a[1] + b[0] + b[1];
  const float hi = static_cast<float>(sum);
  const float lo = static_cast<float>(sum - hi);
  MCC_ASSIGN_OR_RETURN(Tensor both,
                       Tensor::FromVector({hi, lo, 0.0f, 0.0f}, {4}));
  return stats->CopyFrom(both);
}

absl::StatusOr<double> Optimizer::ParamsNorm() {
  // Offloaded main copies live in host memory: summed there, then added.
  std::vector<Tensor> counted, expert, counted_host, expert_host;
  for (const Range& r : ranges_) {
    if (!r.counted) continue;
    std::vector<Tensor>& out = r.offloaded
                                   ? (r.expert ? expert_host : counted_host)
                                   : (r.expert ? expert : counted);
    if (r.master.defined()) {
      out.push_back(r.master);
    } else {
      MCC_ASSIGN_OR_RETURN(Tensor v, View(r.param->value, r));
      out.push_back(std::move(v));
    }
  }
  Tensor stats = Tensor::Empty({4}, DType::kFloat32, device_);
  MCC_RETURN_IF_ERROR(ops::MultiTensorSumOfSquares(
      counted, {}, ops::SumOfSquaresOptions(), &stats));
  Tensor expert_stats = Tensor::Empty({4}, DType::kFloat32, device_);
  MCC_RETURN_IF_ERROR(ops::MultiTensorSumOfSquares(
      expert, {}, ops::SumOfSquaresOptions(), &expert_stats));
  MCC_RETURN_IF_ERROR(AddHostSumOfSquares(counted_host, &stats));
  MCC_RETURN_IF_ERROR(AddHostSumOfSquares(expert_host, &expert_stats));
  MCC_RETURN_IF_ERROR(
      ReduceStats(&stats, has_expert() ? &expert_stats : nullptr));
  MCC_ASSIGN_OR_RETURN(Tensor host, stats.To(Device::CPU()));
  const std::vector<float> v = host.ToFloats();
  return std::sqrt(static_cast<double>(v[0]) + static_cast<double>(v[1]));
}

absl::StatusOr<std::vector<double>> Optimizer::GradNormsByGroup(
    int num_groups, const std::function<int(const Parameter&)>& group_of) {
  if (num_groups <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: GradNormsByGroup over ", num_groups, " groups"));
  }
  std::vector<std::vector<Tensor>> by_group(num_groups);
  std::vector<std::vector<Tensor>> experts_by_group(num_groups);
  for (const Range& r : ranges_) {
    if (!r.counted) continue;
    const int g = group_of(*r.param);
    if (g < 0 || g >= num_groups) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: parameter '", r.param->name, "' in group ",
                       g, " of ", num_groups));
    }
    MCC_ASSIGN_OR_RETURN(Tensor grad, GradOf(r));
    (r.expert ? experts_by_group : by_group)[g].push_back(std::move(grad));
  }
  Tensor stats = Tensor::Empty({4 * num_groups}, DType::kFloat32, device_);
  Tensor expert_stats =
      Tensor::Empty({4 * num_groups}, DType::kFloat32, device_);
  ops::SumOfSquaresOptions options;
  options.scale = 1.0 / loss_scale();
  for (int g = 0; g < num_groups; ++g) {
    MCC_ASSIGN_OR_RETURN(Tensor out, stats.Slice(4 * g, 4 * g + 4));
    MCC_RETURN_IF_ERROR(
        ops::MultiTensorSumOfSquares(by_group[g], {}, options, &out));
    MCC_ASSIGN_OR_RETURN(Tensor eout, expert_stats.Slice(4 * g, 4 * g + 4));
    MCC_RETURN_IF_ERROR(
        ops::MultiTensorSumOfSquares(experts_by_group[g], {}, options, &eout));
  }
  MCC_RETURN_IF_ERROR(
      ReduceStats(&stats, has_expert() ? &expert_stats : nullptr));
  MCC_ASSIGN_OR_RETURN(Tensor host, stats.To(Device::CPU()));
  const std::vector<float> v = host.ToFloats();
  std::vector<double> norms(num_groups);
  for (int g = 0; g < num_groups; ++g) {
    norms[g] = std::sqrt(static_cast<double>(v[4 * g]) +
                         static_cast<double>(v[4 * g + 1]));
  }
  return norms;
}

absl::StatusOr<StepInfo> Optimizer::Step(double lr) {
  Tensor stats = Tensor::Empty({4}, DType::kFloat32, device_);
  MCC_RETURN_IF_ERROR(ComputeGradStats(&stats));
  // The step's one device-to-host read (none on the CPU).
  Tensor host = stats;
  if (!device_.is_cpu()) {
    MCC_ASSIGN_OR_RETURN(host, stats.To(Device::CPU()));
  }
  const std::vector<float> values = host.ToFloats();
  return ApplyStep(lr, values);
}

double GradNormOfStats(absl::Span<const float> grad_stats) {
  return std::sqrt(static_cast<double>(grad_stats[0]) +
                   static_cast<double>(grad_stats[1]));
}

absl::StatusOr<StepInfo> Optimizer::ApplyStep(
    double lr, absl::Span<const float> grad_stats) {
  if (grad_stats.size() != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: ApplyStep needs the 4 values of "
                     "ComputeGradStats, got ",
                     grad_stats.size()));
  }
  StepInfo info;
  info.lr = lr;
  info.loss_scale = loss_scale();
  const double inv_scale = 1.0 / info.loss_scale;
  info.grad_norm = GradNormOfStats(grad_stats);
  if (config_.log_num_zeros_in_grad) {
    info.num_zeros =
        static_cast<int64_t>(std::llround(static_cast<double>(grad_stats[2]) +
                                          static_cast<double>(grad_stats[3])));
  }
  // The sum of squares is never negative: its root is finite just when it is.
  if (!std::isfinite(info.grad_norm)) {
    info.skipped = true;
    if (scaler_) scaler_->Update(true);
    LOG(WARNING) << "optimizer: found inf or NaN in the gradients at step "
                 << step_ + 1 << "; skipping the update"
                 << (scaler_ ? absl::StrCat(" (loss scale ", info.loss_scale,
                                            " -> ", scaler_->scale(), ")")
                             : std::string());
    return info;
  }

  float grad_scale = static_cast<float>(inv_scale);
  if (config_.clip_grad > 0) {
    const double coef = config_.clip_grad / (info.grad_norm + 1e-6);
    if (coef < 1.0) grad_scale = static_cast<float>(inv_scale * coef);
  }
  ++step_;
  // Offloaded ranges: their gradients start for the host first, the device
  // steps its own ranges meanwhile, and the host steps its share while
  // those kernels run.
  std::optional<DeviceEvent> grads_on_host;
  if (side_ != nullptr) {
    MCC_ASSIGN_OR_RETURN(grads_on_host, FetchOffloadedGrads());
  }
  UpdateHyper base;
  base.lr = static_cast<float>(lr);
  base.grad_scale = grad_scale;
  base.step = step_;
  for (Range& r : ranges_) {
    if (r.offloaded) continue;
    MCC_ASSIGN_OR_RETURN(Tensor g, GradOf(r));
    // A main copy of our own (16-bit weights) refreshes the parameter's
    // value; otherwise the main copy is the model (fp32 weights, a
    // wrapper's shard).
    Tensor model;
    if (r.own_master) {
      MCC_ASSIGN_OR_RETURN(model, View(r.param->value, r));
    }
    MCC_RETURN_IF_ERROR(
        UpdateRange(base, g, &r, r.own_master ? &model : nullptr));
  }
  if (grads_on_host.has_value()) {
    MCC_RETURN_IF_ERROR(StepOffloaded(base, *grads_on_host));
  }
  if (scaler_) scaler_->Update(false);
  if (after_update_) MCC_RETURN_IF_ERROR(after_update_());
  return info;
}

absl::Status Optimizer::UpdateRange(const UpdateHyper& base, const Tensor& grad,
                                    Range* r, Tensor* model16) {
  UpdateHyper h = base;
  h.weight_decay =
      r->param->weight_decay ? static_cast<float>(config_.weight_decay) : 0.f;
  if (config_.state_precision.lowered()) {
    return ApplyLowered(h, grad, r, model16);
  }
  const bool write16 = model16 != nullptr && rule_->Writes16BitCopy();
  MCC_RETURN_IF_ERROR(rule_->Apply(h, grad, &r->master, &r->state,
                                   write16 ? model16 : nullptr));
  if (model16 != nullptr && !write16) {
    MCC_RETURN_IF_ERROR(ops::Convert(r->master, model16));
  }
  return absl::OkStatus();
}

absl::Status Optimizer::ApplyLowered(const UpdateHyper& h, const Tensor& grad,
                                     Range* r, Tensor* model16) {
  // fp32 working copies for one range at a time: the transient cost is one
  // range's worth, the saving is every range's state.
  auto widen = [](const Tensor& t) -> absl::StatusOr<Tensor> {
    if (t.dtype() == DType::kFloat32) return t;
    return t.To(DType::kFloat32);
  };
  MCC_ASSIGN_OR_RETURN(Tensor master, widen(r->master));
  std::vector<Tensor> state;
  for (const Tensor& t : r->state) {
    MCC_ASSIGN_OR_RETURN(Tensor wide, widen(t));
    state.push_back(std::move(wide));
  }
  // The model's 16-bit copy comes from the fp32 result, before the main
  // copy is rounded to its storage dtype.
  const bool write16 = model16 != nullptr && rule_->Writes16BitCopy();
  MCC_RETURN_IF_ERROR(
      rule_->Apply(h, grad, &master, &state, write16 ? model16 : nullptr));
  if (model16 != nullptr && !write16) {
    MCC_RETURN_IF_ERROR(ops::Convert(master, model16));
  }
  // Round to nearest into the stored tensors (fp32 ones were updated in
  // place).
  if (r->master.dtype() != DType::kFloat32) {
    MCC_RETURN_IF_ERROR(ops::Convert(master, &r->master));
  }
  for (size_t i = 0; i < state.size(); ++i) {
    if (r->state[i].dtype() != DType::kFloat32) {
      MCC_RETURN_IF_ERROR(ops::Convert(state[i], &r->state[i]));
    }
  }
  return absl::OkStatus();
}

std::vector<StateTensor> Optimizer::StateTensors() {
  std::vector<StateTensor> out;
  const std::vector<std::string> names = rule_->StateNames();
  for (Range& r : ranges_) {
    auto add = [&](const std::string& state, const Tensor& t) {
      StateTensor s;
      s.name = absl::StrCat(r.param->name, ".", state);
      s.param_name = r.param->name;
      s.param = r.param.get();
      s.state = state;
      s.tensor = t;
      s.offset = r.begin;
      s.param_shape = r.shape;
      s.global_shape = r.param->global_shape;
      out.push_back(std::move(s));
    };
    add("main_param", r.master);
    for (size_t i = 0; i < names.size(); ++i) add(names[i], r.state[i]);
  }
  return out;
}

absl::StatusOr<std::string> Optimizer::FirstNonFiniteGradient() const {
  for (const Range& r : ranges_) {
    MCC_ASSIGN_OR_RETURN(Tensor g, GradOf(r));
    Tensor host = g;
    if (!g.device().is_cpu()) {
      MCC_ASSIGN_OR_RETURN(host, g.To(Device::CPU()));
    }
    const std::vector<double> values = host.ToDoubles();
    for (size_t i = 0; i < values.size(); ++i) {
      if (std::isfinite(values[i])) continue;
      return absl::StrCat("'", r.param->name, "' elements [", r.begin, ", ",
                          r.end, ") (element ", r.begin + i, " is ", values[i],
                          ")");
    }
  }
  return std::string();
}

int64_t Optimizer::offloaded_state_bytes() const {
  int64_t bytes = 0;
  for (const Range& r : ranges_) {
    if (!r.offloaded) continue;
    bytes += static_cast<int64_t>(r.master.nbytes());
    for (const Tensor& t : r.state) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

int64_t Optimizer::offloaded_elements() const {
  int64_t n = 0;
  for (const Range& r : ranges_) {
    if (r.offloaded) n += r.end - r.begin;
  }
  return n;
}

int64_t Optimizer::offloaded_pieces() const {
  int64_t n = 0;
  for (const Range& r : ranges_) n += r.offloaded;
  return n;
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const Range& r : ranges_) {
    if (r.own_master) bytes += static_cast<int64_t>(r.master.nbytes());
    for (const Tensor& t : r.state) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

}  // namespace optim
}  // namespace mcc
