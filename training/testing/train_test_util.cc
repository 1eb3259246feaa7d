#include "training/testing/train_test_util.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/ops/elementwise.h"
#include "core/status_macros.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/grad_consistency.h"
#include "parallel/data_parallel/replica_groups.h"
#include "parallel/data_parallel/weight_hash.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "training/trainer.h"

namespace mcc {
namespace optim {
namespace testing {

gpt::GPTConfig TinyConfig() {
  gpt::GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.vocab_size = 128;
  c.seq_length = 16;
  c.seed = 7;
  return c;
}

gpt::MicroBatch FixedBatch(const gpt::GPTConfig& c, int step, int index) {
  // A few distinct batches recur, so the loss can fall over 50 steps.
  std::mt19937 rng(1000 + 17 * (step % 5) + index);
  constexpr int64_t kBatch = 2;
  std::vector<int64_t> tokens(kBatch * c.seq_length), labels(tokens.size());
  for (auto& t : tokens) t = rng() % (c.vocab_size / 2);
  for (size_t i = 0; i < labels.size(); ++i) {
    // Next-token labels of a simple rule, with some positions ignored.
    labels[i] = (i % 7 == 3) ? -100 : (tokens[i] * 3 + 1) % c.vocab_size;
  }
  gpt::MicroBatch b;
  b.tokens = *Tensor::FromInts(tokens, {kBatch, c.seq_length});
  b.labels = *Tensor::FromInts(labels, {kBatch, c.seq_length});
  return b;
}

void PackDocuments(gpt::MicroBatch* batch, int index) {
  const int64_t b = batch->tokens.size(0), s = batch->tokens.size(1);
  constexpr int64_t kLengths[] = {3, 7, 1, 5, 9};
  std::vector<int64_t> starts, positions;
  for (int64_t bi = 0; bi < b; ++bi) {
    int64_t next = (bi + index) % 5, start = 0;
    int64_t end = kLengths[next];
    for (int64_t t = 0; t < s; ++t) {
      if (t == end) {
        start = t;
        next = (next + 1) % 5;
        end = t + kLengths[next];
      }
      starts.push_back(start);
      positions.push_back(t - start);
    }
  }
  batch->document_start = *Tensor::FromInts(starts, {b, s}, DType::kInt32);
  batch->position_ids = *Tensor::FromInts(positions, {b, s});
}

absl::StatusOr<TrainResult> Train(const TrainOptions& o,
                                  parallel::ParallelState* state) {
  parallel::LayerContext ctx;
  ctx.tp_group = state ? state->tensor() : nullptr;
  if (ctx.tp_group != nullptr && ctx.tp_group->size() == 1) {
    ctx.tp_group = nullptr;
  }
  ctx.sequence_parallel = o.sequence_parallel && ctx.tp_group != nullptr;
  ctx.dtype = o.dtype;
  ctx.seed = o.model.seed;
  comm::ProcessGroup* cp = state ? state->context() : nullptr;
  if (cp != nullptr && cp->size() == 1) cp = nullptr;
  ctx.cp_group = cp;
  ctx.cp_comm_type = o.cp_comm_type;
  if (o.expert_layout && state != nullptr) {
    ctx.expert_layout = true;
    ctx.expert_model_group = state->expert_model();
    ctx.expert_tensor_group = state->expert_tensor();
    ctx.moe_alltoall_dispatcher = o.moe_alltoall;
  }
  pipeline::PipelineConfig split = o.pipeline;
  split.num_layers = o.model.num_layers;
  comm::ProcessGroup* pp = state ? state->pipeline() : nullptr;
  if (pp != nullptr && pp->size() != split.pipeline_size) {
    return absl::InvalidArgumentError("pipeline size does not match state");
  }
  MCC_ASSIGN_OR_RETURN(
      auto model,
      gpt::StageModel::Create(o.model, ctx, split, pp ? pp->rank() : 0));
  MCC_ASSIGN_OR_RETURN(
      auto executor,
      pipeline::PipelineExecutor::Create(
          model->stages(),
          pp != nullptr && pp->size() > 1
              ? (o.pipeline_p2p_group != nullptr ? o.pipeline_p2p_group : pp)
              : nullptr,
          o.schedule));
  comm::ProcessGroup* dp = state ? state->data() : nullptr;
  const int dp_size = dp ? dp->size() : 1;
  const int dp_rank = dp ? dp->rank() : 0;
  if (o.global_microbatches % dp_size != 0) {
    return absl::InvalidArgumentError("global batch not divisible by DP");
  }
  const int local_mb = o.global_microbatches / dp_size;

  OptimizerGroups groups;
  if (state != nullptr) {
    groups.tensor = state->tensor();
    groups.pipeline = state->pipeline();
    groups.model = state->model();
    if (o.expert_layout) {
      groups.expert_tensor_model = state->expert_tensor_model();
    }
  }
  // Data parallelism as the train binary wires it (DDP, with the
  // distributed optimizer when asked).
  std::unique_ptr<data_parallel::DataParallel> ddp;
  std::unique_ptr<Optimizer> opt;
  if (o.use_ddp) {
    fsdp::FsdpConfig config;
    config.strategy = o.ddp.use_distributed_optimizer
                          ? fsdp::ShardingStrategy::kOptim
                          : fsdp::ShardingStrategy::kNoShard;
    if (fsdp::ShardsGradients(o.sharding)) config.strategy = o.sharding;
    config.ddp = o.ddp;
    if (o.expert_layout) config.ddp.expert_data = state->expert_data();
    if (state != nullptr && state->instance() != nullptr) {
      // HSDP (--num-distributed-optimizer-instances), as train wires it.
      config.ddp.hybrid.instance = state->instance();
      config.ddp.hybrid.cross_instance = state->cross_instance();
      config.ddp.hybrid.expert_instance = state->expert_instance();
      config.ddp.hybrid.expert_cross_instance = state->expert_cross_instance();
    }
    // Under CP gradients are reduced over DP x CP (Megatron's
    // data-parallel group with context parallelism).
    MCC_ASSIGN_OR_RETURN(ddp, training::WrapDataParallel(
                                  training::AsModels(model->chunks()),
                                  cp ? state->data_context() : dp, pp, config));
    MCC_ASSIGN_OR_RETURN(opt, ddp->CreateOptimizer(o.optimizer, groups));
  } else {
    MCC_ASSIGN_OR_RETURN(
        opt, Optimizer::Create(model->parameters(), o.optimizer, groups));
  }
  MCC_ASSIGN_OR_RETURN(LrSchedule schedule, LrSchedule::Create(o.lr));

  TrainResult result;
  training::TrainerParts parts;
  parts.models = training::AsModels(model->chunks());
  parts.executor = executor.get();
  parts.data_parallel = ddp.get();
  parts.optimizer = opt.get();
  parts.dp_group = dp;
  parts.context_group = cp;
  // ZB-V holds both tied copies on stage 0 (summed there).
  parts.embedding_group =
      state != nullptr && !split.v_shape ? state->embedding() : nullptr;
  data_parallel::ReplicaGroupSources sources;
  if (state != nullptr) {
    sources.data = state->data();
    sources.tensor = state->tensor();
    sources.context = state->context();
    sources.embedding = state->embedding();
  }
  training::TrainerOptions options;
  options.pack_expert_weights = o.pack_expert_weights;
  options.before_optimizer_step = [&](int64_t iteration) -> absl::Status {
    const int step = static_cast<int>(iteration - 1);
    // WrapDataParallel gives the replicated implementation here.
    if (auto* replicated =
            dynamic_cast<data_parallel::DistributedDataParallel*>(ddp.get())) {
      result.param_gather = replicated->param_gather_trace();
      result.num_buckets = static_cast<int>(replicated->buckets().size());
    }
    if (o.grad_consistency_interval > 0 &&
        iteration % o.grad_consistency_interval == 0) {
      MCC_RETURN_IF_ERROR(
          data_parallel::CheckGradConsistencyAcrossReplicaGroups(
              data_parallel::GradientReplicaGroups(model->parameters(), sources,
                                                   ddp.get()),
              data_parallel::HeldGradientsOf(ddp.get())));
    }
    for (int s : o.inject_inf_steps) {
      if (s == step && (o.inject_inf_stage < 0 ||
                        o.inject_inf_stage == (pp ? pp->rank() : 0))) {
        model->parameters()[0]->main_grad.data<float>()[0] = INFINITY;
      }
    }
    return absl::OkStatus();
  };
  MCC_ASSIGN_OR_RETURN(auto trainer,
                       training::Trainer::Create(parts, schedule, options));
  for (int step = 0; step < o.steps; ++step) {
    std::vector<gpt::MicroBatch> batches;
    for (int i = 0; i < local_mb; ++i) {
      batches.push_back(FixedBatch(o.model, step, dp_rank * local_mb + i));
      if (o.packed_documents) {
        PackDocuments(&batches.back(), dp_rank * local_mb + i);
      }
    }
    MCC_RETURN_IF_ERROR(model->SetMicroBatches(std::move(batches)));
    MCC_ASSIGN_OR_RETURN(training::StepMetrics m,
                         trainer->Step(local_mb, step + 1));
    // Megatron steps the expert biases once per step (MoE models only).
    MCC_RETURN_IF_ERROR(model->UpdateExpertBias(dp));
    result.max_in_flight =
        std::max(result.max_in_flight, m.pipeline.max_in_flight);
    result.max_held_outputs =
        std::max(result.max_held_outputs, m.pipeline.max_held_outputs);
    if (auto* sharded =
            dynamic_cast<fsdp::FullyShardedDataParallel*>(ddp.get())) {
      result.split_backward_opens = std::max(
          result.split_backward_opens, sharded->stats().split_backward_opens);
    }
    StepInfo info;
    info.grad_norm = m.grad_norm;
    info.skipped = m.skipped;
    info.loss_scale = m.loss_scale;
    info.lr = m.lr;
    result.loss.push_back(m.loss);
    result.steps.push_back(info);
    if (!o.corrupt_weight.empty() && step == o.corrupt_step &&
        state != nullptr && state->world()->rank() == o.corrupt_rank) {
      MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
      for (const auto& p : model->parameters()) {
        if (p->name != o.corrupt_weight) continue;
        MCC_ASSIGN_OR_RETURN(Tensor first, p->value.Slice(0, 1));
        MCC_RETURN_IF_ERROR(ops::Fill(0.125, &first));
      }
    }
    if (o.weight_hash_interval > 0 &&
        (step + 1) % o.weight_hash_interval == 0) {
      MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
      if (ddp != nullptr) MCC_RETURN_IF_ERROR(ddp->GatherFullParams());
      MCC_RETURN_IF_ERROR(data_parallel::CheckWeightHashAcrossReplicaGroups(
          data_parallel::ReplicaGroupsOf(model->parameters(), sources)));
      if (ddp != nullptr) MCC_RETURN_IF_ERROR(ddp->ReleaseFullParams());
    }
  }
  MCC_RETURN_IF_ERROR(trainer->WaitForParameters());
  return result;
}

absl::StatusOr<double> MeanOverDp(double local, comm::ProcessGroup* dp) {
  return training::MeanOverGroup(local, dp);
}

double RelDiff(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

absl::Status WriteResult(const std::string& path, const TrainResult& r) {
  std::ofstream out(path);
  out.precision(17);
  for (size_t i = 0; i < r.loss.size(); ++i) {
    out << r.loss[i] << " " << r.steps[i].grad_norm << " " << r.steps[i].skipped
        << " " << r.steps[i].loss_scale << "\n";
  }
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> ReadResult(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  TrainResult r;
  std::string loss, norm, skipped, scale;
  // strtod reads "inf" and "nan" too.
  while (in >> loss >> norm >> skipped >> scale) {
    r.loss.push_back(std::strtod(loss.c_str(), nullptr));
    StepInfo info;
    info.grad_norm = std::strtod(norm.c_str(), nullptr);
    info.skipped = skipped != "0";
    info.loss_scale = std::strtod(scale.c_str(), nullptr);
    r.steps.push_back(info);
  }
  return r;
}

std::string TmpPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir ? dir : "/tmp", "/", name);
}

}  // namespace testing
}  // namespace optim
}  // namespace mcc
