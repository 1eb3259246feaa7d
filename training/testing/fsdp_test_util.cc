#include "training/testing/fsdp_test_util.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "optim/lr_schedule.h"
#include "training/trainer.h"

namespace mcc {
namespace fsdp {
namespace testing {

optim::testing::TrainOptions ParityOptions() {
  optim::testing::TrainOptions o;
  o.steps = 10;
  o.global_microbatches = 4;
  o.optimizer.weight_decay = 0.01;
  o.optimizer.clip_grad = 2.4;
  o.lr.lr = 2e-3;
  o.lr.min_lr = 2e-4;
  o.lr.warmup_iters = 2;
  o.lr.decay_iters = 10;
  o.lr.decay_style = optim::LrDecayStyle::kCosine;
  return o;
}

absl::StatusOr<optim::testing::TrainResult> TrainFsdp(
    const FsdpTrainOptions& o, parallel::ParallelState* state) {
  const optim::testing::TrainOptions& b = o.base;
  parallel::LayerContext ctx;
  ctx.tp_group = state ? state->tensor() : nullptr;
  if (ctx.tp_group != nullptr && ctx.tp_group->size() == 1) {
    ctx.tp_group = nullptr;
  }
  ctx.sequence_parallel = b.sequence_parallel && ctx.tp_group != nullptr;
  ctx.dtype = b.dtype;
  ctx.seed = b.model.seed;
  MCC_ASSIGN_OR_RETURN(auto model, gpt::GPTModel::Create(b.model, ctx));
  comm::ProcessGroup* dp = state ? state->data() : nullptr;
  const int dp_size = dp ? dp->size() : 1;
  const int dp_rank = dp ? dp->rank() : 0;
  const int tp_rank = state ? state->tensor_rank() : 0;
  if (b.global_microbatches % dp_size != 0) {
    return absl::InvalidArgumentError("global batch not divisible by DP");
  }
  const int local_mb = b.global_microbatches / dp_size;
  optim::OptimizerGroups groups;
  if (state != nullptr) {
    groups.tensor = state->tensor();
    groups.pipeline = state->pipeline();
    groups.model = state->model();
  }
  std::unique_ptr<data_parallel::DataParallel> fsdp;
  std::unique_ptr<optim::Optimizer> opt;
  if (o.use_fsdp) {
    FsdpConfig config = o.fsdp;
    if (state != nullptr && state->instance() != nullptr) {
      // HSDP: the state's instances (ParallelSizes).
      config.ddp.hybrid.instance = state->instance();
      config.ddp.hybrid.cross_instance = state->cross_instance();
    }
    MCC_ASSIGN_OR_RETURN(
        fsdp, training::WrapDataParallel({model.get()}, dp, nullptr, config));
    MCC_ASSIGN_OR_RETURN(opt, fsdp->CreateOptimizer(b.optimizer, groups));
  } else {
    MCC_ASSIGN_OR_RETURN(opt, optim::Optimizer::Create(model->parameters(),
                                                       b.optimizer, groups));
  }
  if (o.on_optimizer) o.on_optimizer(*opt);
  MCC_ASSIGN_OR_RETURN(optim::LrSchedule schedule,
                       optim::LrSchedule::Create(b.lr));
  if (!o.load_path.empty()) {
    MCC_ASSIGN_OR_RETURN(
        TrainingTensors tensors,
        ReadTensors(absl::StrCat(o.load_path, ".tp", tp_rank)));
    MCC_RETURN_IF_ERROR(ScatterTrainingTensors(tensors, model->parameters(),
                                               fsdp.get(), opt.get()));
    opt->set_step_count(o.start_step);
  }

  // Micro-batches one after another through the whole model.
  training::TrainerParts parts;
  parts.models = {model.get()};
  parts.stages = {model.get()};
  parts.data_parallel = fsdp.get();
  parts.optimizer = opt.get();
  parts.dp_group = dp;
  MCC_ASSIGN_OR_RETURN(auto trainer,
                       training::Trainer::Create(parts, schedule));
  optim::testing::TrainResult result;
  for (int step = o.start_step; step < o.start_step + b.steps; ++step) {
    std::vector<gpt::MicroBatch> batches;
    for (int i = 0; i < local_mb; ++i) {
      batches.push_back(
          optim::testing::FixedBatch(b.model, step, dp_rank * local_mb + i));
    }
    model->SetMicroBatches(std::make_shared<const std::vector<gpt::MicroBatch>>(
        std::move(batches)));
    MCC_ASSIGN_OR_RETURN(training::StepMetrics m,
                         trainer->Step(local_mb, step + 1));
    optim::StepInfo info;
    info.grad_norm = m.grad_norm;
    info.skipped = m.skipped;
    info.loss_scale = m.loss_scale;
    info.lr = m.lr;
    result.loss.push_back(m.loss);
    result.steps.push_back(info);
    if (o.after_step) MCC_RETURN_IF_ERROR(o.after_step(step, fsdp.get()));
  }
  MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
  if (!o.save_path.empty()) {
    MCC_ASSIGN_OR_RETURN(
        TrainingTensors tensors,
        GatherTrainingTensors(model->parameters(), fsdp.get(), opt.get(), dp));
    if (dp_rank == 0) {
      MCC_RETURN_IF_ERROR(
          WriteTensors(absl::StrCat(o.save_path, ".tp", tp_rank), tensors));
    }
  }
  return result;
}

absl::Status WriteTensors(const std::string& path,
                          const TrainingTensors& tensors) {
  std::ofstream out(path, std::ios::binary);
  auto put = [&](int64_t v) {
    out.write(reinterpret_cast<const char*>(&v), sizeof(v));
  };
  put(static_cast<int64_t>(tensors.size()));
  for (const auto& [name, t] : tensors) {
    put(static_cast<int64_t>(name.size()));
    out.write(name.data(), static_cast<std::streamsize>(name.size()));
    put(t.dim());
    for (int64_t d : t.shape()) put(d);
    const std::vector<float> values = t.ToFloats();
    out.write(reinterpret_cast<const char*>(values.data()),
              static_cast<std::streamsize>(values.size() * sizeof(float)));
  }
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<TrainingTensors> ReadTensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  auto get = [&]() {
    int64_t v = 0;
    in.read(reinterpret_cast<char*>(&v), sizeof(v));
    return v;
  };
  TrainingTensors tensors;
  const int64_t count = get();
  for (int64_t i = 0; i < count && in; ++i) {
    std::string name(static_cast<size_t>(get()), '\0');
    in.read(name.data(), static_cast<std::streamsize>(name.size()));
    Shape shape(static_cast<size_t>(get()));
    for (auto& d : shape) d = get();
    Tensor t = Tensor::Empty(shape, DType::kFloat32);
    in.read(static_cast<char*>(t.raw_data()),
            static_cast<std::streamsize>(t.nbytes()));
    tensors[name] = t;
  }
  if (!in) return absl::DataLossError(absl::StrCat(path, " is truncated"));
  return tensors;
}

}  // namespace testing
}  // namespace fsdp
}  // namespace mcc
