#include "inference/serving_model.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint_reader.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "inference/checkpoint_weights.h"
#include "inference/device_step.h"
#include "inference/inference_weights.h"
#include "models/gpt/model_config_proto.h"
#include "parallel/mappings.h"
#include "parallel/pipeline/layer_split.h"
#include "training/device_choice.h"
#include "training/model_from_config.h"

namespace mcc {
namespace inference {
namespace {

// --cuda-graph: decode graphs for 1, 2, 4, ... rows up to --max-batch-size
// (itself the last), each step padded to the next.
std::vector<int64_t> GraphBatchSizes(const ServeConfig& serve) {
  std::vector<int64_t> sizes;
  if (!serve.run().cuda_graph()) return sizes;
  for (int64_t b = 1; b < serve.max_batch_size(); b *= 2) sizes.push_back(b);
  sizes.push_back(serve.max_batch_size());
  return sizes;
}

// The fewest KV blocks any rank of `world` (null: this process alone)
// holds: rank 0 plans with its own count, so every rank must hold as many.
absl::StatusOr<int64_t> FewestOverRanks(comm::ProcessGroup* world,
                                        int64_t blocks) {
  if (world == nullptr) return blocks;
  Tensor t = *Tensor::FromInts({blocks}, {1});
  MCC_RETURN_IF_ERROR(world->AllReduceSync(&t, comm::ReduceOp::kMin));
  return t.data<int64_t>()[0];
}

// The engine on `device` (not the CPU): weights in the checkpoint's dtype
// (bf16 for 16-bit checkpoints or --bf16, else fp32), the KV pool sized by
// --kv-cache-bytes or --kv-cache-memory-fraction; refused with the figures
// before any device allocation when they do not fit.
absl::StatusOr<std::unique_ptr<ModelRunner>> DeviceRunner(
    const ServeConfig& serve, InferenceWeights weights,
    const KvCacheShape& shape, DType checkpoint_dtype,
    const training::DeviceChoice& device, const std::string& path,
    comm::ProcessGroup* tp, comm::ProcessGroup* world) {
  DeviceStepOptions options;
  options.device = device.device;
  options.tp = tp;
  options.dtype = checkpoint_dtype == DType::kFloat32 && !serve.run().bf16()
                      ? DType::kFloat32
                      : DType::kBFloat16;
  options.batch_invariant = serve.batch_invariant();
  options.graph_batch_sizes = GraphBatchSizes(serve);
  MCC_ASSIGN_OR_RETURN(const int64_t memory, DeviceMemoryFor(options));
  int64_t blocks = 0;
  if (serve.kv_cache_memory_fraction() > 0 && memory >= 0) {
    const int64_t left = memory - DeviceWeightBytes(weights, options.dtype);
    blocks =
        static_cast<int64_t>(serve.kv_cache_memory_fraction() *
                             static_cast<double>(std::max<int64_t>(left, 0))) /
        shape.BlockBytes();
    if (blocks < 1) {
      MCC_RETURN_IF_ERROR(
          CheckFitsDevice(weights, shape, 1, options, memory, path));
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-cache-memory-fraction ", serve.kv_cache_memory_fraction(),
          " of the ", FormatBytes(std::max<int64_t>(left, 0)), " left on ",
          device.device.ToString(), " after the weights holds no KV block of ",
          shape.BlockBytes(), " bytes"));
    }
  } else {
    MCC_ASSIGN_OR_RETURN(blocks,
                         PagedKvCache::BlocksIn(shape, serve.kv_cache_bytes()));
  }
  MCC_ASSIGN_OR_RETURN(blocks, FewestOverRanks(world, blocks));
  MCC_ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceStep> step,
      DeviceStep::Create(weights, shape, blocks, options, path));
  const gpt::GPTConfig& c = weights.config;
  std::string quantised;
  if (*LinearWeightsFormat(weights) != '\0') {
    // The linear layers against the same weights in bf16 (the issue's
    // "weight memory halves").
    const LinearWeightBytes linear =
        DeviceLinearWeightBytes(weights, DType::kBFloat16);
    quantised = absl::StrFormat(
        " (linear layers %s: %s instead of %s in bf16, %.2fx less)",
        LinearWeightsFormat(weights), FormatBytes(linear.stored),
        FormatBytes(linear.dense),
        linear.stored > 0 ? static_cast<double>(linear.dense) / linear.stored
                          : 0.0);
  }
  LOG(INFO) << absl::StrFormat(
      "serving %s on %s (%s): %d layers, hidden %d, %d heads, vocabulary "
      "%d, context %d; TP %d; weights %s a rank in %s%s, KV cache %d "
      "blocks of %d positions (%s, fp32)%s",
      path, device.device.ToString(), device.reason, c.num_layers,
      c.hidden_size, c.num_attention_heads, c.vocab_size, c.max_positions(),
      weights.tp_size, FormatBytes(step->weight_bytes()),
      DTypeName(options.dtype), quantised, blocks, shape.block_size,
      FormatBytes(step->pool_bytes()),
      options.batch_invariant ? "; batch-invariant GEMMs" : "");
  if (!options.graph_batch_sizes.empty()) {
    LOG(INFO) << "decode steps as CUDA graphs for up to "
              << options.graph_batch_sizes.back()
              << " rows (padded to the next power of two)";
  }
  return std::make_unique<ModelRunner>(
      std::move(weights), std::move(step),
      PagedKvCache::BookkeepingOnly(shape, blocks));
}

}  // namespace

absl::Status CheckServeConfig(const ServeConfig& config) {
  MCC_RETURN_IF_ERROR(
      training::DistributedTimeoutFromConfig(config.run()).status());
  if (config.max_batch_size() < 1) {
    return absl::InvalidArgumentError("--max-batch-size must be at least 1");
  }
  if (config.prefill_chunk_size() < 1) {
    return absl::InvalidArgumentError(
        "--prefill-chunk-size must be at least 1");
  }
  if (config.max_tokens_per_step() != 0 &&
      config.max_tokens_per_step() < config.max_batch_size()) {
    return absl::InvalidArgumentError(
        "--max-tokens-per-step must be 0 or at least --max-batch-size (every "
        "running sequence decodes one token a step)");
  }
  if (config.kv_block_size() < 1) {
    return absl::InvalidArgumentError("--kv-block-size must be at least 1");
  }
  const std::string& batching = config.batching();
  if (batching != "continuous" && batching != "static") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batching must be continuous or static, got ", batching));
  }
  if (config.spin_wait_us() < 0) {
    return absl::InvalidArgumentError("--spin-wait-us must be at least 0");
  }
  if (config.max_body_bytes() < 1 || config.http_threads() < 1) {
    return absl::InvalidArgumentError(
        "--max-body-bytes and --http-threads must be positive");
  }
  if (config.max_prompt_tokens() < 0 || config.max_queued_requests() < 0) {
    return absl::InvalidArgumentError(
        "--max-prompt-tokens and --max-queued-requests must be at least 0");
  }
  const double timeout = config.request_timeout();
  const double read_timeout = config.request_read_timeout();
  if (!(timeout >= 0 && timeout < 1e9) ||
      !(read_timeout > 0 && read_timeout < 1e9)) {
    return absl::InvalidArgumentError(
        "--request-timeout must be at least 0 and --request-read-timeout "
        "positive (seconds)");
  }
  if (!(config.kv_cache_memory_fraction() >= 0 &&
        config.kv_cache_memory_fraction() < 1)) {
    return absl::InvalidArgumentError(
        "--kv-cache-memory-fraction must be in [0, 1)");
  }
  if (config.max_connections() < 1) {
    return absl::InvalidArgumentError("--max-connections must be positive");
  }
  if (config.port() < 0 || config.port() > 65535) {
    return absl::InvalidArgumentError("--port must be in [0, 65535]");
  }
  return absl::OkStatus();
}

absl::StatusOr<training::DeviceChoice> ServingDevice(const ServeConfig& serve) {
  const training::TrainConfig& run = serve.run();
  const std::string& value = run.device();
  MCC_ASSIGN_OR_RETURN(training::DeviceChoice choice,
                       training::ChooseDevice(value));
  if (choice.device.is_cpu()) return choice;
  std::string unsupported;
  if (run.pipeline_model_parallel_size() > 1) {
    unsupported = "a PP layout";
  }
  if (unsupported.empty()) return choice;
  if (value == "auto") {
    choice.device = Device::CPU();
    choice.reason = absl::StrCat(choice.reason, "; but the engine runs ",
                                 unsupported, " on the CPU only, so it does");
    return choice;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device ", value,
                   ": the engine on a device runs TP layouts so far, not ",
                   unsupported, "; use --device cpu"));
}

namespace {

// --random-weights: the run's model with random weights on the device.
absl::StatusOr<ServingModel> LoadRandomModel(const ServeConfig& serve) {
  const training::TrainConfig& run = serve.run();
  ServingModel out;
  MCC_ASSIGN_OR_RETURN(
      out.tokenizer,
      data::CreateTokenizer(
          run.tokenizer_type(),
          data::TokenizerFiles{run.vocab_file(), run.merge_file(),
                               run.tokenizer_model()}));
  const int64_t vocab =
      run.has_vocab_size() ? run.vocab_size() : out.tokenizer->vocab_size();
  MCC_ASSIGN_OR_RETURN(gpt::GPTConfig config,
                       training::GPTConfigFromConfig(run, vocab));
  MCC_RETURN_IF_ERROR(config.Validate(1, /*sequence_parallel=*/false));
  MCC_ASSIGN_OR_RETURN(const training::DeviceChoice device,
                       ServingDevice(serve));
  if (device.device.is_cpu() || training::WorldSizeFromEnvironment() != 1 ||
      !run.load().empty()) {
    return absl::InvalidArgumentError(
        "--random-weights makes the weights on a device (--device cuda) in "
        "one process, without --load");
  }
  MCC_ASSIGN_OR_RETURN(const RandomQuantize quantize,
                       RandomQuantizeFromFlag(serve.quantize()));
  out.job = std::make_unique<training::Job>();
  // The job (one process) needs no device of its own: the step holds it.
  MCC_RETURN_IF_ERROR(training::JoinWorld(
      run, out.job.get(), {Device::CPU(), "the weights live in the step"}));
  InferenceWeights shapes = WeightShapes(config);
  const KvCacheShape shape = CacheShapeFor(shapes, serve.kv_block_size());
  DeviceStepOptions options;
  options.device = device.device;
  options.dtype = DType::kBFloat16;
  options.batch_invariant = serve.batch_invariant();
  options.graph_batch_sizes = GraphBatchSizes(serve);
  MCC_ASSIGN_OR_RETURN(const int64_t memory, DeviceMemoryFor(options));
  int64_t blocks = 0;
  if (serve.kv_cache_memory_fraction() > 0 && memory >= 0) {
    // The weights' bytes as CreateRandom counts them: the shapes' plus the
    // embedding tables.
    const int64_t tables = config.untie_embeddings_and_output_weights ? 2 : 1;
    const LinearWeightBytes linear =
        RandomLinearWeightBytes(shapes, options.dtype, quantize);
    const int64_t weight_bytes =
        DeviceWeightBytes(shapes, options.dtype) - linear.dense +
        linear.stored + tables * shapes.vocab_rows * config.hidden_size * 2;
    blocks = static_cast<int64_t>(serve.kv_cache_memory_fraction() *
                                  static_cast<double>(std::max<int64_t>(
                                      memory - weight_bytes, 0))) /
             shape.BlockBytes();
  } else {
    MCC_ASSIGN_OR_RETURN(blocks,
                         PagedKvCache::BlocksIn(shape, serve.kv_cache_bytes()));
  }
  blocks = std::max<int64_t>(blocks, 1);
  MCC_ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceStep> step,
      DeviceStep::CreateRandom(shapes, shape, blocks, options,
                               static_cast<uint64_t>(config.seed), quantize));
  std::string quantised;
  if (quantize != RandomQuantize::kNone) {
    const LinearWeightBytes linear =
        RandomLinearWeightBytes(shapes, DType::kBFloat16, quantize);
    quantised = absl::StrFormat(
        " (linear layers %s, quantised on the device: %s instead of %s in "
        "bf16, %.2fx less)",
        quantize == RandomQuantize::kInt8 ? "int8" : "FP8 (E4M3)",
        FormatBytes(linear.stored), FormatBytes(linear.dense),
        static_cast<double>(linear.dense) / linear.stored);
  }
  LOG(INFO) << absl::StrFormat(
      "serving random weights (test-only) on %s: %d layers, hidden %d, %d "
      "heads, %d query groups, ffn %d, vocabulary %d, context %d; weights "
      "%s in bf16%s, KV cache %d blocks of %d positions (%s, fp32)%s",
      device.device.ToString(), config.num_layers, config.hidden_size,
      config.num_attention_heads, config.query_groups(), config.ffn(),
      config.vocab_size, config.max_positions(),
      FormatBytes(step->weight_bytes()), quantised, blocks, shape.block_size,
      FormatBytes(step->pool_bytes()),
      options.batch_invariant ? "; batch-invariant GEMMs" : "");
  if (!options.graph_batch_sizes.empty()) {
    LOG(INFO) << "decode steps as CUDA graphs for up to "
              << options.graph_batch_sizes.back()
              << " rows (padded to the next power of two)";
  }
  out.layout.pipeline = out.job->pp();
  out.layout.pp_size = 1;
  out.runner = std::make_unique<ModelRunner>(
      std::move(shapes), std::move(step),
      PagedKvCache::BookkeepingOnly(shape, blocks));
  return out;
}

}  // namespace

absl::StatusOr<ServingModel> LoadServingModel(const ServeConfig& serve) {
  if (serve.random_weights()) return LoadRandomModel(serve);
  const training::TrainConfig& run = serve.run();
  const std::string& dir = run.load();
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        "--load DIR is required: the checkpoint directory to serve");
  }
  auto reader = CheckpointReader::Open(dir);
  if (!reader.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--load ", dir, ": ", reader.status().message()));
  }
  const checkpoint::ModelConfig stored = (*reader)->common_state().model();
  MCC_ASSIGN_OR_RETURN(gpt::GPTConfig config, gpt::FromProto(stored));
  MCC_ASSIGN_OR_RETURN(const int64_t checkpoint_bytes,
                       (*reader)->ShardFileBytes());
  MCC_RETURN_IF_ERROR(gpt::CheckConfigFitsCheckpoint(config, checkpoint_bytes,
                                                     (*reader)->path()));
  config.make_vocab_size_divisible_by = run.make_vocab_size_divisible_by();
  ServingModel out;
  MCC_ASSIGN_OR_RETURN(
      out.tokenizer,
      data::CreateTokenizer(
          run.tokenizer_type(),
          data::TokenizerFiles{run.vocab_file(), run.merge_file(),
                               run.tokenizer_model()}));
  if (out.tokenizer->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer-type ", out.tokenizer->name(), " has ",
        out.tokenizer->vocab_size(), " tokens but ", (*reader)->path(),
        " was trained with a vocabulary of ", config.vocab_size));
  }
  const int tp = run.tensor_model_parallel_size();
  const int pp = run.pipeline_model_parallel_size();
  const int world_size = training::WorldSizeFromEnvironment();
  if (world_size != tp * pp) {
    return absl::InvalidArgumentError(
        absl::StrCat("serve needs exactly --tensor-model-parallel-size x "
                     "--pipeline-model-parallel-size processes (",
                     tp, " x ", pp, "), got a world of ", world_size,
                     " (no data parallelism)"));
  }
  if (absl::Status s = config.Validate(tp, /*sequence_parallel=*/false);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor-model-parallel-size ", tp, " cannot hold ",
                     (*reader)->path(), "'s model: ", s.message()));
  }
  MCC_ASSIGN_OR_RETURN(const training::DeviceChoice device,
                       ServingDevice(serve));
  out.job = std::make_unique<training::Job>();
  training::Job& job = *out.job;
  // On a device the TP group moves its tensors there (NCCL on CUDA); the
  // world and the checkpoint's load stay on host groups.
  MCC_RETURN_IF_ERROR(training::JoinWorld(
      run, &job,
      device.device.is_cpu()
          ? training::DeviceChoice{Device::CPU(),
                                   "the inference engine runs on the CPU"}
          : device));
  job.config = config;
  job.context.tp_group = job.state != nullptr
                             ? job.state->GroupFor(job.tp(), Device::CPU())
                             : nullptr;
  job.context.sequence_parallel = false;
  job.context.dtype = static_cast<DType>(stored.params_dtype());
  if (job.context.dtype != DType::kBFloat16 &&
      job.context.dtype != DType::kFloat16) {
    job.context.dtype = DType::kFloat32;
  }
  job.context.seed = config.seed;
  job.pipeline.num_layers = config.num_layers;
  job.pipeline.pipeline_size = pp;
  MCC_RETURN_IF_ERROR(pipeline::ValidatePipelineConfig(job.pipeline));
  MCC_ASSIGN_OR_RETURN(
      job.model, gpt::StageModel::Create(config, job.context, job.pipeline,
                                         job.pp_rank()));
  MCC_RETURN_IF_ERROR(LoadCheckpointWeights(
      **reader, job.model->chunks(), serve.quantize(), job.is_logging_rank()));
  MCC_ASSIGN_OR_RETURN(InferenceWeights weights,
                       LoadInferenceWeights(*job.model->chunk(0)));
  job.model.reset();  // The engine keeps its own copy (fp32, or int8).
  const KvCacheShape shape = CacheShapeFor(weights, serve.kv_block_size());
  if (!device.device.is_cpu()) {
    MCC_ASSIGN_OR_RETURN(
        out.runner,
        DeviceRunner(serve, std::move(weights), shape, job.context.dtype,
                     device, (*reader)->path(), job.tp(),
                     job.world.has_value() ? job.world->group.get() : nullptr));
    out.layout.world = job.world.has_value() ? job.world->group.get() : nullptr;
    out.layout.pipeline = nullptr;
    out.layout.pp_rank = 0;
    out.layout.pp_size = 1;
    out.layout.tp_rank = job.state != nullptr ? job.state->tensor_rank() : 0;
    return out;
  }
  MCC_ASSIGN_OR_RETURN(PagedKvCache cache,
                       PagedKvCache::Create(shape, serve.kv_cache_bytes()));
  MCC_ASSIGN_OR_RETURN(
      const int64_t blocks,
      FewestOverRanks(job.world.has_value() ? job.world->group.get() : nullptr,
                      cache.num_blocks()));
  if (blocks != cache.num_blocks()) {
    cache = PagedKvCache::WithBlocks(shape, blocks);
  }
  if (job.is_logging_rank()) {
    LOG(INFO) << absl::StrFormat(
        "serving %s: %d layers, hidden %d, %d heads, vocabulary %d, context "
        "%d; TP %d, PP %d; KV cache %d blocks of %d positions per rank",
        (*reader)->path(), config.num_layers, config.hidden_size,
        config.num_attention_heads, config.vocab_size, config.max_positions(),
        tp, pp, blocks, shape.block_size);
  }
  out.layout.world = job.world.has_value() ? job.world->group.get() : nullptr;
  out.layout.pipeline = job.pp();
  out.layout.pp_rank = job.pp_rank();
  out.layout.pp_size = pp;
  out.layout.tp_rank = parallel::GroupRank(job.tp());
  out.runner = std::make_unique<ModelRunner>(std::move(weights), job.tp(),
                                             std::move(cache));
  return out;
}

EngineOptions EngineOptionsFor(const ServeConfig& config,
                               const gpt::GPTConfig& model) {
  EngineOptions options;
  options.scheduler.max_batch_size = config.max_batch_size();
  options.scheduler.prefill_chunk_size = config.prefill_chunk_size();
  options.scheduler.max_tokens_per_step = config.max_tokens_per_step();
  options.scheduler.static_batching = config.batching() == "static";
  options.scheduler.window_left = model.window_left;
  options.max_positions = model.max_positions();
  options.model_vocab = model.vocab_size;
  options.max_prompt_tokens = config.max_prompt_tokens();
  options.max_queued_requests = config.max_queued_requests();
  return options;
}

}  // namespace inference
}  // namespace mcc
