// tools/serve: a trained GPT (--load DIR) behind an HTTP server with
// continuous batching. Rank 0 serves HTTP (Megatron's PUT /api, OpenAI-style
// POST /v1/completions, GET /health, GET /metrics) and plans every step; the
// other ranks of a TP / PP / TP x PP job follow its steps. Any layout loads
// any checkpoint (resharded on load).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint_reader.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "data/tokenizer.h"
#include "glog/logging.h"
#include "inference/checkpoint_weights.h"
#include "inference/distributed_step.h"
#include "inference/engine.h"
#include "inference/inference_weights.h"
#include "inference/model_runner.h"
#include "models/gpt/model_config_proto.h"
#include "parallel/mappings.h"
#include "tools/flags/checkpoint_flags.h"
#include "tools/flags/megatron_args.h"
#include "tools/flags/quantize_flag.h"
#include "tools/flags/runtime_flags.h"
#include "tools/flags/train_config_from_flags.h"
#include "tools/flags/training_flags.h"
#include "tools/serve/http_frontend.h"
#include "training/job.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on.");
ABSL_FLAG(int32_t, port, 8000, "Port to listen on (0: any free port).");
ABSL_FLAG(std::string, port_file, "",
          "Writes the port bound here once listening (for --port 0).");
ABSL_FLAG(int32_t, max_batch_size, 32,
          "Sequences in one decoding step at most (continuous batching).");
ABSL_FLAG(int64_t, prefill_chunk_size, 64,
          "Prompt tokens of one sequence per step (long prompts run in "
          "chunks between decoding steps).");
ABSL_FLAG(int64_t, max_tokens_per_step, 0,
          "Token budget of one step (0: --prefill-chunk-size + "
          "--max-batch-size).");
ABSL_FLAG(int64_t, kv_cache_bytes, int64_t{256} << 20,
          "Bytes of the paged KV cache per rank; requests wait when it is "
          "full.");
ABSL_FLAG(int64_t, kv_block_size, 16, "Positions per KV-cache block.");
ABSL_FLAG(std::string, batching, "continuous",
          "continuous (requests join every step) or static (a batch forms, "
          "runs to completion, then the next; for comparison).");
ABSL_FLAG(int64_t, max_body_bytes, 1 << 20,
          "Request bodies larger than this are refused (413) unread.");
ABSL_FLAG(int32_t, http_threads, 128,
          "Requests handled at once (whole requests: a slow client's bytes "
          "are received by one reader thread first); at least "
          "--max-batch-size + --max-queued-requests + 8 are started.");
ABSL_FLAG(std::string, api_key, "",
          "Clients must send 'Authorization: Bearer KEY' on every route but "
          "/health (401 otherwise). Default: the environment variable "
          "MCC_API_KEY (which, unlike a flag, other users cannot read from "
          "the process list); empty: no key.");
ABSL_FLAG(int64_t, max_prompt_tokens, 0,
          "Prompt tokens one request may hold; more is a 400 (0: the model's "
          "context).");
ABSL_FLAG(int64_t, max_queued_requests, 64,
          "Requests that may wait beyond the --max-batch-size running ones; "
          "more get 429 with Retry-After (0: no bound).");
ABSL_FLAG(double, request_timeout, 600,
          "Seconds a request may take; then its generation is stopped and "
          "its KV blocks freed, and the client gets 504 (or finish_reason "
          "\"timeout\" when streamed). 0: no limit.");
ABSL_FLAG(double, request_read_timeout, 10,
          "Seconds a client has to send a request's headers and body (408 "
          "and closed after); idle kept-alive connections close after 5 s "
          "or this, whichever is less.");
ABSL_FLAG(int32_t, max_connections, 1024,
          "Open connections at once; more are answered 503 and closed.");
ABSL_FLAG(int64_t, spin_wait_us, 200,
          "Microseconds the kernel pool's idle threads poll for the next "
          "loop before sleeping (0: sleep at once). Waking a sleeping thread "
          "costs about as much as one loop of a decoding step on a VM; "
          "polling burns a core, so lower it when the server shares its "
          "cores.");

namespace mcc {
namespace serve {
namespace {

constexpr int kFlagError = 2;

// The flags serve reads; any other training flag given is refused.
const std::set<std::string>& UsedFlags() {
  static const auto* used =
      new std::set<std::string>{"load",
                                "host",
                                "port",
                                "port_file",
                                "max_batch_size",
                                "prefill_chunk_size",
                                "max_tokens_per_step",
                                "kv_cache_bytes",
                                "kv_block_size",
                                "batching",
                                "max_body_bytes",
                                "http_threads",
                                "api_key",
                                "max_prompt_tokens",
                                "max_queued_requests",
                                "request_timeout",
                                "request_read_timeout",
                                "max_connections",
                                "spin_wait_us",
                                "quantize",
                                "tokenizer_type",
                                "vocab_file",
                                "merge_file",
                                "tensor_model_parallel_size",
                                "pipeline_model_parallel_size",
                                "make_vocab_size_divisible_by",
                                "num_threads",
                                "bf16",
                                "fp16",
                                "debug_collectives",
                                "distributed_timeout_minutes"};
  return *used;
}

std::string LoadDir() {
  std::string dir = absl::GetFlag(FLAGS_load);
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (!dir.empty() && dir[0] != '/' && workspace != nullptr) {
    dir = absl::StrCat(workspace, "/", dir);
  }
  return dir;
}

struct Loaded {
  std::unique_ptr<training::Job> job;
  std::unique_ptr<data::Tokenizer> tokenizer;
  std::unique_ptr<inference::ModelRunner> runner;
  inference::StageLayout layout;
};

absl::Status CheckFlags() {
  MCC_ASSIGN_OR_RETURN(const training::TrainConfig train_config,
                       flags::TrainConfigFromFlags());
  MCC_RETURN_IF_ERROR(
      training::DistributedTimeoutFromConfig(train_config).status());
  if (absl::GetFlag(FLAGS_max_batch_size) < 1) {
    return absl::InvalidArgumentError("--max-batch-size must be at least 1");
  }
  if (absl::GetFlag(FLAGS_prefill_chunk_size) < 1) {
    return absl::InvalidArgumentError(
        "--prefill-chunk-size must be at least 1");
  }
  if (absl::GetFlag(FLAGS_max_tokens_per_step) != 0 &&
      absl::GetFlag(FLAGS_max_tokens_per_step) <
          absl::GetFlag(FLAGS_max_batch_size)) {
    return absl::InvalidArgumentError(
        "--max-tokens-per-step must be 0 or at least --max-batch-size (every "
        "running sequence decodes one token a step)");
  }
  if (absl::GetFlag(FLAGS_kv_block_size) < 1) {
    return absl::InvalidArgumentError("--kv-block-size must be at least 1");
  }
  const std::string batching = absl::GetFlag(FLAGS_batching);
  if (batching != "continuous" && batching != "static") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--batching must be continuous or static, got ", batching));
  }
  if (absl::GetFlag(FLAGS_spin_wait_us) < 0) {
    return absl::InvalidArgumentError("--spin-wait-us must be at least 0");
  }
  if (absl::GetFlag(FLAGS_max_body_bytes) < 1 ||
      absl::GetFlag(FLAGS_http_threads) < 1) {
    return absl::InvalidArgumentError(
        "--max-body-bytes and --http-threads must be positive");
  }
  if (absl::GetFlag(FLAGS_max_prompt_tokens) < 0 ||
      absl::GetFlag(FLAGS_max_queued_requests) < 0) {
    return absl::InvalidArgumentError(
        "--max-prompt-tokens and --max-queued-requests must be at least 0");
  }
  const double timeout = absl::GetFlag(FLAGS_request_timeout);
  const double read_timeout = absl::GetFlag(FLAGS_request_read_timeout);
  if (!(timeout >= 0 && timeout < 1e9) ||
      !(read_timeout > 0 && read_timeout < 1e9)) {
    return absl::InvalidArgumentError(
        "--request-timeout must be at least 0 and --request-read-timeout "
        "positive (seconds)");
  }
  if (absl::GetFlag(FLAGS_max_connections) < 1) {
    return absl::InvalidArgumentError("--max-connections must be positive");
  }
  if (absl::GetFlag(FLAGS_port) < 0 || absl::GetFlag(FLAGS_port) > 65535) {
    return absl::InvalidArgumentError("--port must be in [0, 65535]");
  }
  return absl::OkStatus();
}

// The checkpoint's model in this rank's part of the layout, as the engine's
// weights, and this rank's KV cache.
absl::StatusOr<Loaded> Load() {
  const std::string dir = LoadDir();
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
  config.make_vocab_size_divisible_by =
      absl::GetFlag(FLAGS_make_vocab_size_divisible_by);
  Loaded out;
  MCC_ASSIGN_OR_RETURN(
      out.tokenizer, data::CreateTokenizer(absl::GetFlag(FLAGS_tokenizer_type),
                                           absl::GetFlag(FLAGS_vocab_file),
                                           absl::GetFlag(FLAGS_merge_file)));
  if (out.tokenizer->vocab_size() > config.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer-type ", out.tokenizer->name(), " has ",
        out.tokenizer->vocab_size(), " tokens but ", (*reader)->path(),
        " was trained with a vocabulary of ", config.vocab_size));
  }
  const int tp = absl::GetFlag(FLAGS_tensor_model_parallel_size);
  const int pp = absl::GetFlag(FLAGS_pipeline_model_parallel_size);
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
  out.job = std::make_unique<training::Job>();
  training::Job& job = *out.job;
  MCC_ASSIGN_OR_RETURN(const training::TrainConfig train_config,
                       flags::TrainConfigFromFlags());
  MCC_RETURN_IF_ERROR(training::JoinWorld(
      train_config, &job,
      {Device::CPU(), "the inference engine runs on the CPU"}));
  job.config = config;
  job.context.tp_group = job.tp();
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
  MCC_RETURN_IF_ERROR(inference::LoadCheckpointWeights(
      **reader, job.model->chunks(), absl::GetFlag(FLAGS_quantize),
      job.is_logging_rank()));
  MCC_ASSIGN_OR_RETURN(inference::InferenceWeights weights,
                       inference::LoadInferenceWeights(*job.model->chunk(0)));
  job.model.reset();  // The engine keeps its own copy (fp32, or int8).
  const inference::KvCacheShape shape =
      inference::CacheShapeFor(weights, absl::GetFlag(FLAGS_kv_block_size));
  MCC_ASSIGN_OR_RETURN(inference::PagedKvCache cache,
                       inference::PagedKvCache::Create(
                           shape, absl::GetFlag(FLAGS_kv_cache_bytes)));
  // Every rank must hold as many blocks as rank 0 plans with: the fewest.
  int64_t blocks = cache.num_blocks();
  if (job.world.has_value()) {
    Tensor t = *Tensor::FromInts({blocks}, {1});
    MCC_RETURN_IF_ERROR(
        job.world->group->AllReduceSync(&t, comm::ReduceOp::kMin));
    blocks = t.data<int64_t>()[0];
    if (blocks != cache.num_blocks()) {
      cache = inference::PagedKvCache::WithBlocks(shape, blocks);
    }
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
  out.runner = std::make_unique<inference::ModelRunner>(
      std::move(weights), job.tp(), std::move(cache));
  return out;
}

// --api-key, else MCC_API_KEY. Never logged.
std::string ApiKey() {
  std::string key = absl::GetFlag(FLAGS_api_key);
  if (key.empty()) {
    if (const char* env = std::getenv("MCC_API_KEY")) key = env;
  }
  return key;
}

int Serve(Loaded& loaded) {
  const gpt::GPTConfig& config = loaded.runner->weights().config;
  std::unique_ptr<inference::StepExecutor> executor =
      inference::MakeStepExecutor(loaded.runner.get(), loaded.layout);
  ThreadPool::Global().SetSpinMicros(absl::GetFlag(FLAGS_spin_wait_us));
  inference::EngineOptions options;
  options.scheduler.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  options.scheduler.prefill_chunk_size =
      absl::GetFlag(FLAGS_prefill_chunk_size);
  options.scheduler.max_tokens_per_step =
      absl::GetFlag(FLAGS_max_tokens_per_step);
  options.scheduler.static_batching = absl::GetFlag(FLAGS_batching) == "static";
  options.max_positions = config.max_positions();
  options.model_vocab = config.vocab_size;
  options.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  options.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  inference::Engine engine(options, executor.get(), &loaded.runner->cache(),
                           loaded.tokenizer->Clone());
  FrontendOptions frontend_options;
  frontend_options.max_body_bytes =
      static_cast<size_t>(absl::GetFlag(FLAGS_max_body_bytes));
  // A generation holds its handler's thread; with more threads than the
  // engine takes requests, /health and the 429s always find one.
  frontend_options.http_threads = absl::GetFlag(FLAGS_http_threads);
  if (options.max_queued_requests > 0) {
    frontend_options.http_threads = std::max<int64_t>(
        frontend_options.http_threads,
        options.scheduler.max_batch_size + options.max_queued_requests + 8);
  }
  frontend_options.api_key = ApiKey();
  frontend_options.request_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_request_timeout));
  frontend_options.read_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_request_read_timeout));
  frontend_options.idle_timeout =
      std::min(absl::Seconds(5), frontend_options.read_timeout);
  frontend_options.max_connections = absl::GetFlag(FLAGS_max_connections);
  const std::string host = absl::GetFlag(FLAGS_host);
  if (frontend_options.api_key.empty() && host != "127.0.0.1" &&
      host != "localhost" && host != "::1") {
    LOG(WARNING) << "serve: --host " << host
                 << " accepts other machines' connections and no --api-key "
                    "(or MCC_API_KEY) is set: anyone who reaches the port "
                    "can use it";
  }
  HttpFrontend frontend(&engine, loaded.tokenizer->Clone(), frontend_options);
  auto port =
      frontend.Bind(absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_port));
  if (!port.ok()) {
    LOG(ERROR) << "serve: " << port.status().message();
    (void)executor->Shutdown();
    return 1;
  }
  absl::Status engine_status;
  std::thread engine_thread([&] {
    engine_status = engine.Run();
    if (!engine_status.ok()) {
      frontend.SetUnhealthy(std::string(engine_status.message()));
      frontend.Stop();
    }
  });
  LOG(INFO) << "serve: listening on http://" << absl::GetFlag(FLAGS_host) << ":"
            << *port;
  if (const std::string file = absl::GetFlag(FLAGS_port_file); !file.empty()) {
    std::ofstream(file + ".tmp") << *port << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
  }
  const absl::Status listened = frontend.Listen();
  engine.Stop();
  engine_thread.join();
  if (!listened.ok()) {
    LOG(ERROR) << "serve: " << listened.message();
    return 1;
  }
  if (!engine_status.ok()) {
    LOG(ERROR) << "serve: the engine stopped: " << engine_status;
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace serve
}  // namespace mcc

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  auto parsed = mcc::flags::ParseMegatronArgs(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "serve: %s\n",
                 std::string(parsed.status().message()).c_str());
    return mcc::serve::kFlagError;
  }
  mcc::flags::ApplyRuntimeFlags();
  if (!parsed->positional.empty()) {
    std::fprintf(stderr, "serve: unexpected argument '%s'\n",
                 parsed->positional[0].c_str());
    return mcc::serve::kFlagError;
  }
  for (const std::string& flag : parsed->explicitly_set) {
    if (mcc::serve::UsedFlags().count(flag) == 0) {
      std::fprintf(stderr,
                   "serve: --%s is not used by serve (the model comes from "
                   "the checkpoint; serve trains nothing)\n",
                   flag.c_str());
      return mcc::serve::kFlagError;
    }
  }
  if (absl::Status s = mcc::serve::CheckFlags(); !s.ok()) {
    std::fprintf(stderr, "serve: %s\n", std::string(s.message()).c_str());
    return mcc::serve::kFlagError;
  }
  mcc::training::ConfigureThreads(mcc::flags::TrainConfigFromFlags().value_or(
      mcc::training::TrainConfig()));
  auto loaded = mcc::serve::Load();
  if (!loaded.ok()) {
    LOG(ERROR) << "serve: " << loaded.status().message();
    return 1;
  }
  if (loaded->job->rank != 0) {
    // Follow rank 0's steps until it shuts down.
    absl::Status s =
        mcc::inference::FollowSteps(loaded->runner.get(), loaded->layout);
    if (!s.ok()) {
      LOG(ERROR) << "serve: rank " << loaded->job->rank << " stops: " << s;
      return 1;
    }
    return 0;
  }
  return mcc::serve::Serve(*loaded);
}
