#include "training/checkpointing.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "models/gpt/model_config_proto.h"
#include "parallel/mappings.h"

namespace mcc {
namespace training {
namespace {

constexpr char kRngKey[] = "dropout_forward_calls";

// The optimizer's state tensors grouped by (parameter, state).
// By parameter, not name: ZB-V's stage 0 holds two copies of the tied
// embedding under one name, and each gathers its own pieces over DP.
std::map<std::pair<const Parameter*, std::string>, optim::StateTensor>
StateIndex(optim::Optimizer* optimizer) {
  std::map<std::pair<const Parameter*, std::string>, optim::StateTensor> index;
  if (optimizer == nullptr) return index;
  for (auto& s : optimizer->StateTensors()) {
    index[{s.param, s.state}] = s;
  }
  return index;
}

std::vector<std::string> StateNames(optim::Optimizer* optimizer) {
  std::vector<std::string> names;
  if (optimizer == nullptr) return names;
  for (const auto& s : optimizer->StateTensors()) {
    if (std::find(names.begin(), names.end(), s.state) == names.end()) {
      names.push_back(s.state);
    }
  }
  return names;
}

// WholeLocalState's gather, in fp32.
absl::StatusOr<Tensor> WholeLocalStateFp32(const Job& job,
                                           optim::Optimizer* optimizer,
                                           const Parameter& p,
                                           const optim::StateTensor* s) {
  const int64_t n = p.value.numel();
  // Where the optimizer shards: DP (x CP), or an instance under HSDP.
  comm::ProcessGroup* dp = optimizer->shard_group() != nullptr
                               ? optimizer->shard_group()
                               : job.grad_dp();
  // Expert weights' state is sharded over the expert-data-parallel group.
  if (p.expert_parallel) dp = optimizer->expert_shard_group();
  if (!optimizer->sharded() || dp == nullptr || dp->size() == 1) {
    if (s == nullptr || s->tensor.numel() != n) {
      return absl::InternalError(absl::StrCat("optimizer state of ", p.name,
                                              " does not cover the parameter"));
    }
    Tensor t = s->tensor.Clone();
    if (t.dtype() != DType::kFloat32) {
      MCC_ASSIGN_OR_RETURN(t, s->tensor.To(DType::kFloat32));
    }
    return t.Reshape(p.value.shape());
  }
  // The state lives on the job's device; the counts are host scalars, each
  // over the data-parallel group's twin for its device.
  const Device device = p.value.device();
  Tensor mine =
      s != nullptr ? s->tensor : Tensor::Empty({0}, DType::kFloat32, device);
  if (mine.dtype() != DType::kFloat32) {
    MCC_ASSIGN_OR_RETURN(mine, mine.To(DType::kFloat32));
  }
  // A piece the optimizer keeps in host memory (--optimizer-cpu-offload)
  // joins the other ranks' gather on the job's device.
  if (mine.device() != device) {
    MCC_ASSIGN_OR_RETURN(mine, mine.To(device));
  }
  MCC_ASSIGN_OR_RETURN(mine, mine.Reshape({-1}));
  Tensor count =
      Tensor::Full({1}, static_cast<double>(mine.numel()), DType::kInt64);
  Tensor counts = Tensor::Empty({dp->size()}, DType::kInt64);
  MCC_RETURN_IF_ERROR(
      job.GroupFor(dp, Device::CPU())->AllGatherSync(count, &counts));
  std::vector<int64_t> rows(dp->size());
  int64_t total = 0;
  for (int r = 0; r < dp->size(); ++r) {
    // A peer's count sizes the gather: checked before it reaches one.
    rows[r] = counts.data<int64_t>()[r];
    if (rows[r] < 0 || rows[r] > n) {
      return absl::InternalError(
          absl::StrCat("distributed optimizer shards of ", p.name, ": rank ", r,
                       " of the data-parallel group announced ", rows[r],
                       " of ", n, " elements"));
    }
    total = CheckedAdd(total, rows[r]).value_or(-1);
  }
  if (total != n) {
    return absl::InternalError(absl::StrCat("distributed optimizer shards of ",
                                            p.name, " hold ", total, " of ", n,
                                            " elements"));
  }
  Tensor whole = Tensor::Empty({n}, DType::kFloat32, mine.device());
  MCC_RETURN_IF_ERROR(
      job.GroupFor(dp, mine.device())->AllGatherVSync(mine, &whole, rows));
  return whole.Reshape(p.value.shape());
}

// The dtype a state is saved in: Adam's moments in their storage dtype
// (--exp-avg-dtype, --exp-avg-sq-dtype: every parameter's alike), the rest
// in fp32. A load converts to whatever the loading run stores.
DType SavedStateDType(const optim::Optimizer& optimizer,
                      const std::string& state) {
  if (state == "exp_avg" || state == "exp_avg_sq") {
    return optimizer.config().state_precision.Of(state);
  }
  return DType::kFloat32;
}

// The whole local (TP-piece) tensor of one state, in SavedStateDType: this
// rank's flat range, all-gathered over DP (in fp32, whatever each rank
// stores) when the optimizer is sharded.
absl::StatusOr<Tensor> WholeLocalState(const Job& job,
                                       optim::Optimizer* optimizer,
                                       const Parameter& p,
                                       const std::string& state,
                                       const optim::StateTensor* s) {
  MCC_ASSIGN_OR_RETURN(Tensor whole, WholeLocalStateFp32(job, optimizer, p, s));
  const DType saved = SavedStateDType(*optimizer, state);
  if (saved == DType::kFloat32) return whole;
  return whole.To(saved);
}

}  // namespace

std::optional<ShardedTensorRef> ParameterRef(const std::string& name,
                                             const Parameter& p,
                                             const Tensor& local) {
  ShardedTensorRef ref =
      p.partition_dim >= 0
          ? ShardedTensorRef::SplitAlong(name, local, p.partition_dim,
                                         p.partition_rank, p.partition_count)
          : ShardedTensorRef::Replicated(name, local);
  if (p.unpadded_rows < 0) return ref;
  // Only the model's rows: the padding depends on the layout.
  const int64_t keep = std::clamp<int64_t>(
      p.unpadded_rows - ref.global_offsets[0], 0, local.size(0));
  if (keep == 0) return std::nullopt;
  ref.global_shape[0] = p.unpadded_rows;
  if (keep < local.size(0)) ref.local = *local.Slice(0, keep);
  return ref;
}

absl::StatusOr<std::vector<ShardedTensorRef>> ParameterRefs(
    const std::string& name, const Parameter& p, const Tensor& local) {
  std::vector<ShardedTensorRef> refs;
  if (!p.expert_parallel || p.expert_tensor_count <= 1) {
    if (auto ref = ParameterRef(name, p, local)) refs.push_back(*ref);
    return refs;
  }
  // An expert weight sliced over ETP: the EP box (dimension 0), and along
  // expert_tensor_dim this rank's piece of each of the blocks.
  const int d = p.expert_tensor_dim;
  const int blocks = p.expert_tensor_blocks;
  const int q = p.expert_tensor_rank;
  const int count = p.expert_tensor_count;
  const Shape& global = p.global_shape;
  if (d < 1 || d >= static_cast<int>(global.size()) ||
      local.dim() != static_cast<int>(global.size()) || blocks < 1 || q < 0 ||
      q >= count || global[d] % (int64_t{blocks} * count) != 0 ||
      local.size(d) * count != global[d] ||
      (p.partition_dim >= 0 && p.partition_dim != 0)) {
    return absl::InternalError(absl::StrCat(
        name, ": expert tensor slice (dimension ", d, ", rank ", q, " of ",
        count, ", ", blocks, " blocks) of local ", local.ShapeString(),
        " does not fit global ", ShapeToString(global)));
  }
  const int64_t block = global[d] / blocks;  // f rows (or columns)
  const int64_t piece = block / count;       // this rank's share of each
  Shape offsets(global.size(), 0);
  if (p.partition_dim == 0) offsets[0] = p.partition_rank * local.size(0);
  if (blocks == 1) {
    offsets[d] = q * piece;
    refs.push_back(ShardedTensorRef{name, global, offsets, local});
    return refs;
  }
  // Two or more blocks (SwiGLU's gate and up): each expert's piece of a
  // block is contiguous only when the blocks split dimension 1, so one box
  // per (expert, block), each a view of the local tensor.
  if (d != 1) {
    return absl::InternalError(
        absl::StrCat(name, ": expert tensor blocks split along dimension ", d,
                     "; only dimension 1 is built"));
  }
  Shape rows = local.shape();
  rows[0] *= blocks;
  rows[1] = piece;
  MCC_ASSIGN_OR_RETURN(Tensor by_block, local.Reshape(rows));
  for (int64_t i = 0; i < rows[0]; ++i) {
    Shape at = offsets;
    at[0] += i / blocks;
    at[1] = (i % blocks) * block + q * piece;
    MCC_ASSIGN_OR_RETURN(Tensor view, by_block.Slice(i, i + 1));
    refs.push_back(ShardedTensorRef{name, global, at, view});
  }
  return refs;
}

absl::Status LoadParameterRef(CheckpointReader& reader,
                              const ShardedTensorRef& ref, bool vocab_padded) {
  MCC_ASSIGN_OR_RETURN(const checkpoint::TensorRecord* t,
                       reader.FindTensor(ref.name));
  // int8 values read as floats would be garbage, not weights.
  if ((t->dtype() == checkpoint::DTYPE_INT8) !=
      (ref.local.dtype() == DType::kInt8)) {
    return absl::FailedPreconditionError(absl::StrCat(
        ref.name, " in ", reader.path(), " is ",
        t->dtype() == checkpoint::DTYPE_INT8 ? "int8" : "not int8",
        " but this run holds it as ", DTypeName(ref.local.dtype()),
        " (int8 checkpoints come from convert_checkpoint --quantize int8 and "
        "load only into eval)"));
  }
  const Shape stored(t->global_shape().begin(), t->global_shape().end());
  const checkpoint::ModelConfig& config = reader.common_state().model();
  if (vocab_padded && stored.size() == ref.global_shape.size() &&
      stored[0] > ref.global_shape[0] && stored[0] == StoredVocabRows(config) &&
      ref.global_shape[0] == config.vocab_size() &&
      std::equal(stored.begin() + 1, stored.end(),
                 ref.global_shape.begin() + 1)) {
    // Written before the padding left the model: the rows past the
    // vocabulary are that run's padding, not read.
    Tensor local = ref.local;
    MCC_RETURN_IF_ERROR(ref.Validate());
    return reader.ReadRegion(ref.name, ref.global_offsets, &local);
  }
  return reader.Load({ref});
}

absl::Status LoadParameters(CheckpointReader& reader,
                            const ParameterList& params) {
  for (const auto& p : params) {
    MCC_ASSIGN_OR_RETURN(std::vector<ShardedTensorRef> refs,
                         ParameterRefs(p->name, *p, p->value));
    for (const ShardedTensorRef& ref : refs) {
      MCC_RETURN_IF_ERROR(LoadParameterRef(reader, ref, p->unpadded_rows >= 0));
    }
  }
  return absl::OkStatus();
}

absl::Status SaveTrainingCheckpoint(const std::string& dir, const Job& job,
                                    optim::Optimizer* optimizer,
                                    const optim::LrSchedule& schedule,
                                    const TrainingProgress& progress,
                                    const DistContext& dist,
                                    AsyncCheckpointSaver* async, int keep_last,
                                    LocalCheckpointer* local) {
  std::vector<ShardedTensorRef> refs;
  auto index = StateIndex(optimizer);
  const std::vector<std::string> states = StateNames(optimizer);
  for (const auto& p : job.model->parameters()) {
    // A rank holding only vocabulary padding saves nothing of this tensor.
    MCC_ASSIGN_OR_RETURN(std::vector<ShardedTensorRef> mine,
                         ParameterRefs(p->name, *p, p->value));
    refs.insert(refs.end(), mine.begin(), mine.end());
    for (const std::string& state : states) {
      auto it = index.find({p.get(), state});
      // Collective over DP: every rank gathers, whether it saves or not.
      MCC_ASSIGN_OR_RETURN(
          Tensor whole,
          WholeLocalState(job, optimizer, *p, state,
                          it == index.end() ? nullptr : &it->second));
      MCC_ASSIGN_OR_RETURN(
          mine, ParameterRefs(absl::StrCat("optimizer.", state, ".", p->name),
                              *p, whole));
      refs.insert(refs.end(), mine.begin(), mine.end());
    }
  }
  // Buffers (the routers' expert biases): replicated, no optimizer state.
  for (const auto& b : job.model->buffers()) {
    refs.push_back(*ParameterRef(b->name, *b, b->value));
  }
  checkpoint::CommonState common;
  common.set_iteration(progress.iteration);
  common.set_consumed_train_samples(progress.consumed_train_samples);
  *common.mutable_model() = ToProto(job.config, job.context.dtype);
  auto* parallel = common.mutable_parallel();
  parallel->set_tensor_model_parallel_size(parallel::GroupSize(job.tp()));
  parallel->set_pipeline_model_parallel_size(job.pipeline.pipeline_size);
  parallel->set_data_parallel_size(job.dp_size());
  parallel->set_context_parallel_size(
      job.state ? job.state->layout().context_size() : 1);
  parallel->set_sequence_parallel(job.context.sequence_parallel);
  parallel->set_use_distributed_optimizer(optimizer != nullptr &&
                                          optimizer->sharded());
  parallel->set_world_size(job.world_size);
  auto* lr = common.mutable_lr_scheduler();
  lr->set_max_lr(schedule.config().lr);
  lr->set_min_lr(schedule.config().min_lr);
  lr->set_warmup_steps(schedule.warmup_iters());
  lr->set_decay_steps(schedule.config().decay_iters);
  lr->set_num_steps(progress.iteration);
  lr->set_current_lr(schedule.LearningRate(progress.iteration));
  if (optimizer != nullptr) {
    (*common.mutable_extra())["optimizer_step"] =
        std::to_string(optimizer->step_count());
    if (optim::LossScaler* scaler = optimizer->loss_scaler()) {
      auto* ls = common.mutable_loss_scaler();
      ls->set_dynamic(scaler->is_dynamic());
      ls->set_scale(scaler->state().scale);
      ls->set_growth_tracker(scaler->state().growth_tracker);
      ls->set_hysteresis_tracker(
          static_cast<int32_t>(scaler->state().hysteresis_tracker));
    }
  }
  checkpoint::RankState rank_state;
  rank_state.set_rank(job.rank);
  (*rank_state.mutable_rng_states())[kRngKey] =
      std::to_string(job.model->rng_calls());
  if (local != nullptr) {
    return local->Save(progress.iteration, refs, common, rank_state);
  }
  SaveOptions options;
  options.keep_last = keep_last;
  if (async != nullptr) {
    return async->Start(dir, progress.iteration, refs, common, rank_state, dist,
                        options);
  }
  return SaveCheckpoint(dir, progress.iteration, refs, common, rank_state, dist,
                        options);
}

absl::StatusOr<TrainingProgress> LoadModelCheckpoint(const std::string& dir,
                                                     Job& job, bool load_rng) {
  MCC_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir));
  MCC_RETURN_IF_ERROR(
      reader->CheckModelConfig(ToProto(job.config, job.context.dtype)));
  MCC_RETURN_IF_ERROR(LoadParameters(*reader, job.model->parameters()));
  MCC_RETURN_IF_ERROR(LoadParameters(*reader, job.model->buffers()));
  const checkpoint::CommonState& common = reader->common_state();
  if (load_rng) {
    // Ranks beyond the saved world continue rank 0's stream (the dropout
    // stream is the same on every rank by construction).
    auto state = reader->RankStateOf(job.rank);
    if (!state.ok()) state = reader->RankStateOf(0);
    if (state.ok()) {
      auto it = state->rng_states().find(kRngKey);
      if (it != state->rng_states().end()) {
        job.model->set_rng_calls(std::stoull(it->second));
      }
    }
  }
  TrainingProgress progress;
  progress.iteration = common.iteration();
  progress.consumed_train_samples = common.consumed_train_samples();
  if (job.is_logging_rank()) {
    LOG(INFO) << "loaded " << reader->path() << " (iteration "
              << progress.iteration << ", " << progress.consumed_train_samples
              << " samples consumed)";
  }
  return progress;
}

absl::Status LoadOptimizerCheckpoint(const std::string& dir, const Job& job,
                                     optim::Optimizer* optimizer) {
  MCC_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir));
  const checkpoint::CommonState& common = reader->common_state();
  // Every state tensor of the name: ZB-V's stage 0 holds two copies of the
  // tied embedding (the output layer's), each with its own state.
  std::vector<optim::StateTensor> all_states = optimizer->StateTensors();
  std::set<std::string> loaded;
  for (const auto& p : job.model->parameters()) {
    if (!loaded.insert(p->name).second) continue;
    for (optim::StateTensor& s : all_states) {
      if (s.param_name != p->name) continue;
      const std::string name =
          absl::StrCat("optimizer.", s.state, ".", p->name);
      if (!reader->FindTensor(name).ok()) {
        return absl::NotFoundError(absl::StrCat(
            dir, " holds no ", name,
            " (saved with another optimizer? use --no-load-optim)"));
      }
      // Zeros: the vocabulary padding's state is not stored.
      Tensor whole = Tensor::Zeros(p->value.shape(), DType::kFloat32);
      MCC_ASSIGN_OR_RETURN(std::vector<ShardedTensorRef> refs,
                           ParameterRefs(name, *p, whole));
      for (const ShardedTensorRef& ref : refs) {
        MCC_RETURN_IF_ERROR(
            LoadParameterRef(*reader, ref, p->unpadded_rows >= 0));
      }
      MCC_ASSIGN_OR_RETURN(Tensor flat, whole.Reshape({-1}));
      MCC_ASSIGN_OR_RETURN(Tensor piece,
                           flat.Slice(s.offset, s.offset + s.tensor.numel()));
      MCC_ASSIGN_OR_RETURN(Tensor target, s.tensor.Reshape({-1}));
      // Into this run's storage dtype (saved bf16 moments load into fp32
      // ones and the reverse), rounding to nearest.
      if (target.dtype() != piece.dtype()) {
        MCC_ASSIGN_OR_RETURN(piece, piece.To(target.dtype()));
      }
      MCC_RETURN_IF_ERROR(target.CopyFrom(piece));
    }
  }
  auto step = common.extra().find("optimizer_step");
  if (step != common.extra().end()) {
    optimizer->set_step_count(std::stoll(step->second));
  }
  if (optim::LossScaler* scaler = optimizer->loss_scaler();
      scaler != nullptr && common.has_loss_scaler()) {
    optim::LossScaler::State st;
    st.scale = common.loss_scaler().scale();
    st.growth_tracker = common.loss_scaler().growth_tracker();
    st.hysteresis_tracker = common.loss_scaler().hysteresis_tracker();
    scaler->set_state(st);
  }
  return absl::OkStatus();
}

}  // namespace training
}  // namespace mcc
