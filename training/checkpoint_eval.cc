#include "training/checkpoint_eval.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_reader.h"
#include "core/status_macros.h"
#include "data/blended_dataset.h"
#include "data/loader.h"
#include "glog/logging.h"
#include "inference/checkpoint_weights.h"
#include "inference/device_step.h"
#include "inference/distributed_step.h"
#include "inference/engine.h"
#include "inference/inference_weights.h"
#include "inference/model_runner.h"
#include "models/gpt/model_config_proto.h"
#include "parallel/mappings.h"
#include "parallel/pipeline/layer_split.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/rank_layout.h"
#include "training/device_choice.h"
#include "training/evaluation.h"
#include "training/job.h"
#include "training/model_from_config.h"
#include "training/trainer.h"

namespace mcc {
namespace training {
namespace {

std::string Dashed(const std::string& name) {
  return absl::StrReplaceAll(name, {{"_", "-"}});
}

// Every model field the config sets must agree with the checkpoint; the
// message names each (as its flag) and both values.
absl::Status CheckModelFields(const EvalPlan& plan) {
  const TrainConfig& run = plan.config.run();
  const checkpoint::ModelConfig& m = plan.stored;
  std::vector<std::string> errors;
  auto check = [&](bool given, const std::string& flag,
                   const std::string& field, const std::string& value,
                   const std::string& stored) {
    if (!given || value == stored) return;
    errors.push_back(absl::StrCat("--", Dashed(flag), " ", value,
                                  " disagrees with the checkpoint's ", field,
                                  " ", stored));
  };
  auto str = [](auto v) { return absl::StrCat(v); };
  auto boolean = [](bool v) { return std::string(v ? "true" : "false"); };
  check(run.has_num_layers(), "num_layers", "num_layers", str(run.num_layers()),
        str(m.num_layers()));
  check(run.has_hidden_size(), "hidden_size", "hidden_size",
        str(run.hidden_size()), str(m.hidden_size()));
  check(run.has_num_attention_heads(), "num_attention_heads",
        "num_attention_heads", str(run.num_attention_heads()),
        str(m.num_attention_heads()));
  check(run.has_group_query_attention(), "group_query_attention",
        "num_query_groups < num_attention_heads",
        boolean(run.group_query_attention()),
        boolean(m.num_query_groups() > 0 &&
                m.num_query_groups() < m.num_attention_heads()));
  check(run.has_num_query_groups(), "num_query_groups", "num_query_groups",
        str(run.num_query_groups()), str(m.num_query_groups()));
  check(run.has_ffn_hidden_size() && run.ffn_hidden_size() > 0,
        "ffn_hidden_size", "ffn_hidden_size", str(run.ffn_hidden_size()),
        str(m.ffn_hidden_size()));
  check(run.has_seq_length(), "seq_length", "seq_length", str(run.seq_length()),
        str(m.seq_length()));
  check(run.has_max_position_embeddings() && run.max_position_embeddings() > 0,
        "max_position_embeddings", "max_position_embeddings",
        str(run.max_position_embeddings()), str(m.max_position_embeddings()));
  check(run.has_position_embedding_type(), "position_embedding_type",
        "position_embedding_type", run.position_embedding_type(),
        m.position_embedding_type() == checkpoint::POSITION_EMBEDDING_ROPE
            ? "rope"
            : "learned_absolute");
  check(run.has_rotary_base(), "rotary_base", "rotary_base",
        str(run.rotary_base()), str(m.rotary_base()));
  const bool scaled = m.has_rope_scaling();
  check(run.has_use_rope_scaling(), "use_rope_scaling", "rope_scaling",
        boolean(run.use_rope_scaling()), boolean(scaled));
  check(run.has_rope_scaling_factor(), "rope_scaling_factor",
        "rope_scaling.factor", str(run.rope_scaling_factor()),
        scaled ? str(m.rope_scaling().factor()) : "none");
  check(run.has_rope_scaling_low_freq_factor(), "rope_scaling_low_freq_factor",
        "rope_scaling.low_freq_factor", str(run.rope_scaling_low_freq_factor()),
        scaled ? str(m.rope_scaling().low_freq_factor()) : "none");
  check(run.has_rope_scaling_high_freq_factor(),
        "rope_scaling_high_freq_factor", "rope_scaling.high_freq_factor",
        str(run.rope_scaling_high_freq_factor()),
        scaled ? str(m.rope_scaling().high_freq_factor()) : "none");
  check(run.has_rope_scaling_original_max_position_embeddings(),
        "rope_scaling_original_max_position_embeddings",
        "rope_scaling.original_max_position_embeddings",
        str(run.rope_scaling_original_max_position_embeddings()),
        scaled ? str(m.rope_scaling().original_max_position_embeddings())
               : "none");
  check(run.has_normalization(), "normalization", "normalization",
        run.normalization(),
        m.normalization() == checkpoint::NORMALIZATION_RMS_NORM ? "RMSNorm"
                                                                : "LayerNorm");
  check(run.has_norm_epsilon(), "norm_epsilon", "layernorm_epsilon",
        str(run.norm_epsilon()), str(m.layernorm_epsilon()));
  check(run.has_swiglu(), "swiglu", "activation", boolean(run.swiglu()),
        boolean(m.activation() == checkpoint::ACTIVATION_SWIGLU));
  check(run.has_untie_embeddings_and_output_weights(),
        "untie_embeddings_and_output_weights", "tied_embeddings (negated)",
        boolean(run.untie_embeddings_and_output_weights()),
        boolean(!m.tied_embeddings()));
  check(run.has_disable_bias_linear(), "disable_bias_linear",
        "add_bias_linear (negated)", boolean(run.disable_bias_linear()),
        boolean(!m.add_bias_linear()));
  check(run.has_qk_layernorm(), "qk_layernorm", "qk_layernorm",
        boolean(run.qk_layernorm()), boolean(m.qk_layernorm()));
  check(run.has_add_qkv_bias(), "add_qkv_bias", "add_qkv_bias",
        boolean(run.add_qkv_bias()), boolean(m.add_qkv_bias()));
  check(run.has_vocab_size(), "vocab_size", "vocab_size", str(run.vocab_size()),
        str(m.vocab_size()));
  // --window-size "L,0" is the checkpoint's sliding_window L + 1.
  const auto window = WindowLeftOf(run.window_size());
  check(run.has_window_size(), "window_size", "sliding_window",
        window.ok() ? str(*window + 1) : run.window_size(),
        str(m.sliding_window()));
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      absl::StrJoin(errors, "; "), " (", plan.checkpoint_path,
      "); eval takes the model configuration from the checkpoint"));
}

// --prompt-ids: ids separated by spaces or commas, each a token of the
// model's vocabulary; at least one.
absl::StatusOr<std::vector<int64_t>> ParsePromptIds(
    const std::string& text, const gpt::GPTConfig& config) {
  std::vector<int64_t> ids;
  for (absl::string_view word :
       absl::StrSplit(text, absl::ByAnyChar(" ,\t\n"), absl::SkipEmpty())) {
    int64_t id = 0;
    if (!absl::SimpleAtoi(word, &id) || id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: '", word, "' is not a token id in [0, ",
                       config.vocab_size, "), the model's vocabulary"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--prompt-ids: no token ids in '", text, "'"));
  }
  return ids;
}

}  // namespace

absl::StatusOr<EvalPlan> PlanCheckpointEval(const EvalConfig& config,
                                            int world_size) {
  const TrainConfig& run = config.run();
  MCC_RETURN_IF_ERROR(CheckDevice(run.device()));
  MCC_RETURN_IF_ERROR(DistributedTimeoutFromConfig(run).status());
  EvalPlan plan;
  plan.config = config;
  if (run.load().empty()) {
    return absl::InvalidArgumentError(
        "--load DIR is required: the checkpoint directory to evaluate");
  }
  auto reader = CheckpointReader::Open(run.load());
  if (!reader.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--load ", run.load(), ": ", reader.status().message()));
  }
  plan.stored = (*reader)->common_state().model();
  plan.checkpoint_path = (*reader)->path();
  MCC_RETURN_IF_ERROR(CheckModelFields(plan));
  MCC_ASSIGN_OR_RETURN(plan.model, gpt::FromProto(plan.stored));
  MCC_ASSIGN_OR_RETURN(const int64_t checkpoint_bytes,
                       (*reader)->ShardFileBytes());
  MCC_RETURN_IF_ERROR(gpt::CheckConfigFitsCheckpoint(
      plan.model, checkpoint_bytes, plan.checkpoint_path));
  plan.model.seed = static_cast<uint64_t>(run.seed());
  // The padding is this layout's (it never changes the logits).
  plan.model.make_vocab_size_divisible_by = run.make_vocab_size_divisible_by();

  const int tp = run.tensor_model_parallel_size();
  MCC_RETURN_IF_ERROR(parallel::RankLayout::Create(
                          world_size, {tp, run.pipeline_model_parallel_size(),
                                       run.context_parallel_size()})
                          .status());
  if (run.context_parallel_size() != 1) {
    return absl::UnimplementedError(
        "--context-parallel-size must be 1: eval runs tensor, pipeline and "
        "data parallelism");
  }
  {
    pipeline::PipelineConfig split;
    split.num_layers = plan.model.num_layers;
    split.pipeline_size = run.pipeline_model_parallel_size();
    if (absl::Status s = pipeline::ValidatePipelineConfig(split); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(plan.checkpoint_path, "'s ", plan.model.num_layers,
                       " layers: ", s.message()));
    }
  }
  if (absl::Status s = plan.model.Validate(tp, /*sequence_parallel=*/false);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor-model-parallel-size ", tp, " cannot hold ",
                     plan.checkpoint_path, "'s model: ", s.message()));
  }
  // Parameters in the checkpoint's dtype unless --bf16 or --fp16 says
  // otherwise (either set to false: fp32).
  plan.dtype = static_cast<DType>(plan.stored.params_dtype());
  if (run.has_bf16() || run.has_fp16()) {
    plan.dtype = run.bf16()   ? DType::kBFloat16
                 : run.fp16() ? DType::kFloat16
                              : DType::kFloat32;
  }
  if (plan.dtype != DType::kFloat32 && plan.dtype != DType::kBFloat16 &&
      plan.dtype != DType::kFloat16) {
    plan.dtype = DType::kFloat32;
  }
  if (run.micro_batch_size() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--micro-batch-size must be positive, got ", run.micro_batch_size()));
  }

  plan.ids_in = !config.prompt_ids().empty();
  if (plan.ids_in && !config.prompt().empty()) {
    return absl::InvalidArgumentError(
        "--prompt and --prompt-ids exclude each other: give the prompt as "
        "text or as token ids");
  }
  plan.generate = plan.ids_in || !config.prompt().empty();
  plan.evaluate = plan.generate ? run.has_eval_iters() && run.eval_iters() > 0
                                : run.eval_iters() > 0;
  if (!plan.generate && !plan.evaluate) {
    return absl::InvalidArgumentError(
        "nothing to do: give --prompt TEXT, --prompt-ids IDS or a positive "
        "--eval-iters");
  }
  if (run.eval_iters() < 0) {
    return absl::InvalidArgumentError("--eval-iters must not be negative");
  }
  if (plan.evaluate && !run.mock_data()) {
    const std::string path = run.data_path();
    if (!path.empty()) {
      MCC_ASSIGN_OR_RETURN(data::Blend blend, data::ParseDataPath(path));
      for (const std::string& prefix : blend.prefixes) {
        for (const char* ext : {".bin", ".idx"}) {
          if (std::FILE* f = std::fopen((prefix + ext).c_str(), "rb")) {
            std::fclose(f);
          } else {
            return absl::NotFoundError(
                absl::StrCat("--data-path: ", prefix, ext, " does not exist"));
          }
        }
      }
    }
    MCC_RETURN_IF_ERROR(data::ParseSplit(run.split()).status());
  }
  const bool text_out = plan.generate && !config.output_ids();
  const bool text_in = plan.generate && !plan.ids_in;
  if (text_in || text_out || (plan.evaluate && !run.mock_data())) {
    MCC_ASSIGN_OR_RETURN(
        plan.tokenizer,
        data::CreateTokenizer(
            run.tokenizer_type(),
            data::TokenizerFiles{run.vocab_file(), run.merge_file(),
                                 run.tokenizer_model()}));
    if (plan.tokenizer->vocab_size() > plan.model.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokenizer-type ", plan.tokenizer->name(), " has ",
          plan.tokenizer->vocab_size(), " tokens but ", plan.checkpoint_path,
          " was trained with a vocabulary of ", plan.model.vocab_size));
    }
  }
  if (plan.generate) {
    const double temperature = config.temperature();
    const double top_p = config.top_p();
    if (temperature < 0 || !std::isfinite(temperature)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--temperature must be >= 0, got ", temperature));
    }
    if (config.top_k() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--top-k must be >= 0, got ", config.top_k()));
    }
    if (top_p < 0 || top_p > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--top-p must be in [0, 1], got ", top_p));
    }
    if (config.max_new_tokens() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--max-new-tokens must be positive, got ", config.max_new_tokens()));
    }
    if (plan.ids_in) {
      MCC_ASSIGN_OR_RETURN(plan.prompt_ids,
                           ParsePromptIds(config.prompt_ids(), plan.model));
    } else {
      std::vector<int32_t> ids;
      plan.tokenizer->Encode(config.prompt(), &ids);
      plan.prompt_ids.assign(ids.begin(), ids.end());
    }
    // The model was trained on positions [0, max_positions).
    const int64_t room = plan.model.max_positions();
    if (static_cast<int64_t>(plan.prompt_ids.size()) >= room) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt is ", plan.prompt_ids.size(), " tokens; the model (",
          plan.checkpoint_path, ") holds ", room, " positions, so at most ",
          room - 1, " leave room to generate"));
    }
    plan.max_new_tokens =
        std::min<int64_t>(config.max_new_tokens(),
                          room - static_cast<int64_t>(plan.prompt_ids.size()));
    if (plan.max_new_tokens < config.max_new_tokens()) {
      LOG(WARNING) << "--max-new-tokens " << config.max_new_tokens()
                   << ": only " << plan.max_new_tokens
                   << " fit after the prompt in the model's " << room
                   << " positions";
    }
  }
  return plan;
}

// The job (world, groups, model) for the plan: the checkpoint's model, built
// without sequence parallelism (decoding one token cannot split the
// sequence; the weights do not depend on it).
namespace {

absl::StatusOr<std::unique_ptr<Job>> SetupEvalJob(const EvalPlan& plan) {
  const EvalConfig& config = plan.config;
  const TrainConfig& run = config.run();
  auto job = std::make_unique<Job>();
  MCC_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(run.load()));
  MCC_ASSIGN_OR_RETURN(DeviceChoice device, ChooseDevice(run.device()));
  // The int8 and FP8 weight GEMMs have CPU kernels only, and the inference
  // engine (generation) runs on a device for one process holding the whole
  // model (inference/device_step.h): other runs stay on the host.
  const auto& extra = reader->common_state().extra();
  const auto quantization = extra.find("quantization");
  const bool quantised =
      !config.quantize().empty() ||
      (quantization != extra.end() && quantization->second == "int8");
  const bool one_process = WorldSizeFromEnvironment() == 1;
  if (!device.device.is_cpu() &&
      (quantised || (plan.generate && !one_process))) {
    device = {Device::CPU(),
              absl::StrCat(device.reason, "; but ",
                           quantised ? "quantised (int8 or FP8) weights"
                                     : "generation (the inference engine) over "
                                       "several processes",
                           " run on the CPU only, so this run does")};
  }
  MCC_RETURN_IF_ERROR(JoinWorld(run, job.get(), std::move(device)));
  if (job->world.has_value() && job->is_logging_rank() &&
      job->world->group->options().debug_collectives) {
    LOG(INFO) << "every collective's fingerprint checked";
  }
  if (plan.tokenizer != nullptr) job->tokenizer = plan.tokenizer->Clone();
  job->vocab_size = plan.stored.vocab_size();
  job->config = plan.model;
  job->context.tp_group = job->tp();
  // Decoding one token cannot split the sequence; the weights are the same
  // (--sequence-parallel warns).
  job->context.sequence_parallel = false;
  job->context.dtype = plan.dtype;
  job->context.seed = job->config.seed;
  job->context.device = job->device.device;
  job->pipeline.num_layers = job->config.num_layers;
  job->pipeline.pipeline_size = run.pipeline_model_parallel_size();
  MCC_ASSIGN_OR_RETURN(job->model,
                       gpt::StageModel::Create(job->config, job->context,
                                               job->pipeline, job->pp_rank()));
  // The weights: this rank's box of every global tensor (whatever padding
  // the checkpoint's or this layout's vocabulary has).
  MCC_RETURN_IF_ERROR(inference::LoadCheckpointWeights(
      *reader, job->model->chunks(), config.quantize(),
      job->is_logging_rank()));
  if (job->is_logging_rank()) {
    int64_t params = 0;
    for (const auto& p : job->model->parameters())
      params += NumElements(p->global_shape);
    LOG(INFO) << absl::StrFormat(
        "loaded %s: %d layers, hidden %d, %d heads, vocabulary %d (%d rows "
        "with the padding for TP), sequence %d; %.2fM parameters; %s; world "
        "%d (TP %d, DP %d)",
        reader->path(), job->config.num_layers, job->config.hidden_size,
        job->config.num_attention_heads, job->config.vocab_size,
        job->config.padded_vocab_size(parallel::GroupSize(job->tp())),
        job->config.seq_length, params / 1e6, DTypeName(plan.dtype),
        job->world_size, parallel::GroupSize(job->tp()), job->dp_size());
  }
  return job;
}

// Mean loss over `iters` micro-batches of a split, summed over DP.
// Forward only, through the pipeline's stages when there are several (the
// executor hands the loss totals to every stage).
absl::StatusOr<double> EvaluateSplit(Job& job, data::DataLoader* loader,
                                     int iters) {
  pipeline::PipelineOptions options;
  options.schedule = job.pp() != nullptr
                         ? pipeline::ScheduleKind::kOneFOneB
                         : pipeline::ScheduleKind::kNoPipelining;
  MCC_ASSIGN_OR_RETURN(auto executor,
                       pipeline::PipelineExecutor::Create(job.model->stages(),
                                                          job.pp(), options));
  return training::EvaluateLoss(job, loader, iters, [&](int n) {
    return training::Evaluate(executor.get(), job.dp(), n);
  });
}

absl::StatusOr<std::vector<SplitLoss>> RunEvaluation(const TrainConfig& run,
                                                     Job& job) {
  const int iters = run.eval_iters();
  const int64_t mbs = run.micro_batch_size();
  const int64_t samples = static_cast<int64_t>(iters) * mbs * job.dp_size();
  MCC_ASSIGN_OR_RETURN(auto datasets,
                       BuildDatasets(run, job, {1, samples, samples}));
  data::LoaderConfig loader_config;
  loader_config.micro_batch_size = mbs;
  loader_config.dp_rank = job.dp_rank();
  loader_config.dp_size = job.dp_size();
  if (job.tokenizer != nullptr) {
    loader_config.eod = job.tokenizer->eod();
    loader_config.eod_mask_loss = run.eod_mask_loss();
    // Only learned position embeddings read positions.
    loader_config.reset_position_ids =
        run.reset_position_ids() &&
        job.config.position_embedding == gpt::PositionEmbedding::kLearned;
    loader_config.reset_attention_mask = run.reset_attention_mask();
  }
  const char* names[] = {"", "validation", "test"};
  std::vector<SplitLoss> losses;
  for (int split : {1, 2}) {
    SplitLoss& result = losses.emplace_back();
    result.split = names[split];
    if (datasets[split] == nullptr) {
      result.empty = true;
      continue;
    }
    MCC_ASSIGN_OR_RETURN(
        auto loader, data::DataLoader::Create(datasets[split], loader_config));
    const absl::Time start = absl::Now();
    MCC_ASSIGN_OR_RETURN(double loss, EvaluateSplit(job, loader.get(), iters));
    if (job.is_logging_rank()) {
      LOG(INFO) << absl::StrFormat("%s: %d micro-batches of %d in %.2f s",
                                   names[split], iters, mbs,
                                   absl::ToDoubleSeconds(absl::Now() - start));
    }
    result.loss = loss;
  }
  return losses;
}

// The continuation on the logging rank; nullopt on the others.
absl::StatusOr<std::optional<Generation>> RunGeneration(Job& job,
                                                        const EvalPlan& plan) {
  const EvalConfig& config = plan.config;
  const TrainConfig& run = config.run();
  const bool use_cache = !config.no_kv_cache();
  std::vector<int64_t> prompt = plan.prompt_ids;
  if (prompt.empty()) {
    if (plan.tokenizer == nullptr) {
      return absl::InvalidArgumentError("--prompt-ids holds no token id");
    }
    prompt.push_back(plan.tokenizer->eod());  // Start a new document.
  }
  const int64_t prompt_len = static_cast<int64_t>(prompt.size());
  // --prompt-ids also reports the prompt's next-token loss.
  const bool prompt_loss = plan.ids_in && prompt_len >= 2;
  MCC_RETURN_IF_ERROR(job.Barrier());
  const absl::Time start = absl::Now();
  // The engine, one request: every rank holds its stage's part of the
  // model; rank 0 plans the steps and the others follow.
  MCC_ASSIGN_OR_RETURN(inference::InferenceWeights weights,
                       inference::LoadInferenceWeights(*job.model->chunk(0)));
  const inference::KvCacheShape shape = inference::CacheShapeFor(weights);
  const int64_t blocks =
      (prompt_len + plan.max_new_tokens + shape.block_size - 1) /
      shape.block_size;
  std::unique_ptr<inference::ModelRunner> owned_runner;
  if (!job.device.device.is_cpu()) {
    // One process (SetupEvalJob): the engine on the job's device, weights
    // in the run's dtype (bf16 stays bf16, the rest fp32).
    inference::DeviceStepOptions options;
    options.device = job.device.device;
    options.dtype = job.context.dtype == DType::kBFloat16 ? DType::kBFloat16
                                                          : DType::kFloat32;
    MCC_ASSIGN_OR_RETURN(std::unique_ptr<inference::DeviceStep> step,
                         inference::DeviceStep::Create(weights, shape, blocks,
                                                       options, run.load()));
    owned_runner = std::make_unique<inference::ModelRunner>(
        std::move(weights), std::move(step),
        inference::PagedKvCache::BookkeepingOnly(shape, blocks));
  } else {
    owned_runner = std::make_unique<inference::ModelRunner>(
        std::move(weights), job.tp(),
        inference::PagedKvCache::WithBlocks(shape, blocks));
  }
  inference::ModelRunner& runner = *owned_runner;
  inference::StageLayout layout;
  layout.world = job.world.has_value() ? job.world->group.get() : nullptr;
  layout.pipeline = job.pp();
  layout.pp_rank = job.pp_rank();
  layout.pp_size = run.pipeline_model_parallel_size();
  layout.tp_rank = parallel::GroupRank(job.tp());
  if (job.rank != 0) {
    MCC_RETURN_IF_ERROR(inference::FollowSteps(&runner, layout));
    return std::optional<Generation>();
  }
  std::unique_ptr<inference::StepExecutor> executor =
      inference::MakeStepExecutor(&runner, layout);
  inference::EngineOptions options;
  options.scheduler.max_batch_size = 1;
  options.scheduler.prefill_chunk_size = prompt_len;  // One prefill step.
  // --no-kv-cache: every token recomputes the whole prefix (for comparison).
  options.scheduler.recompute_prefix = !use_cache;
  options.scheduler.window_left = job.config.window_left;
  options.max_positions = job.config.max_positions();
  options.model_vocab = job.config.vocab_size;
  inference::Engine engine(options, executor.get(), &runner.cache(),
                           plan.tokenizer ? plan.tokenizer->Clone() : nullptr);
  inference::GenerationRequest request;
  request.prompt = prompt;
  request.prompt_logprobs = prompt_loss;
  request.max_new_tokens = plan.max_new_tokens;
  request.sampling.temperature = config.temperature();
  request.sampling.top_k = config.top_k();
  request.sampling.top_p = config.top_p();
  request.sampling.seed = static_cast<uint64_t>(run.seed());
  absl::Time prefilled = start;
  MCC_ASSIGN_OR_RETURN(
      const inference::GenerationEvent result,
      inference::GenerateOne(&engine, std::move(request), &prefilled));
  MCC_RETURN_IF_ERROR(executor->Shutdown());
  const absl::Time done_at = absl::Now();
  Generation out;
  out.tokens = result.tokens;
  out.stopped_at_eod = result.finish_reason == inference::FinishReason::kStop;
  out.prompt_tokens = prompt_len;
  out.prefill_ms = absl::ToDoubleMilliseconds(prefilled - start);
  const int64_t decode_steps =
      std::max<int64_t>(0, static_cast<int64_t>(out.tokens.size()) - 1);
  const double decode_s = absl::ToDoubleSeconds(done_at - prefilled);
  out.decode_tokens_per_s =
      decode_steps > 0 && decode_s > 0 ? decode_steps / decode_s : 0.0;
  const std::vector<double>& logprobs = result.prompt_logprobs;
  if (prompt_loss && !logprobs.empty()) {
    out.prompt_loss = -std::accumulate(logprobs.begin(), logprobs.end(), 0.0) /
                      logprobs.size();
    out.prompt_loss_predictions = static_cast<int64_t>(logprobs.size());
  }
  if (!config.output_ids()) {
    MCC_ASSIGN_OR_RETURN(
        out.text, plan.tokenizer->Decode(absl::MakeConstSpan(out.tokens)));
  }
  return std::optional<Generation>(std::move(out));
}

}  // namespace

absl::StatusOr<EvalResult> EvaluateCheckpoint(const EvalPlan& plan) {
  MCC_ASSIGN_OR_RETURN(std::unique_ptr<Job> job, SetupEvalJob(plan));
  EvalResult result;
  result.reported = job->is_logging_rank();
  if (plan.evaluate) {
    MCC_ASSIGN_OR_RETURN(result.splits, RunEvaluation(plan.config.run(), *job));
  }
  if (plan.generate) {
    MCC_ASSIGN_OR_RETURN(result.generation, RunGeneration(*job, plan));
  }
  MCC_RETURN_IF_ERROR(job->Barrier());
  return result;
}

}  // namespace training
}  // namespace mcc
