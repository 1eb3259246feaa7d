// tools/serve: a trained GPT (--load DIR) behind an HTTP server with
// continuous batching. Rank 0 serves HTTP (Megatron's PUT /api, OpenAI-style
// POST /v1/completions, GET /health, GET /metrics) and plans every step; the
// other ranks of a TP / PP / TP x PP job follow its steps. Any layout loads
// any checkpoint (resharded on load).
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "data/tokenizer_config.h"
#include "glog/logging.h"
#include "inference/serve_config.pb.h"
#include "inference/serving_model.h"
#include "tools/flags/checkpoint_flags.h"
#include "tools/flags/megatron_args.h"
#include "tools/flags/message_from_flags.h"
#include "tools/flags/quantize_flag.h"
#include "tools/flags/runtime_flags.h"
#include "tools/flags/serve_flags.h"
#include "tools/flags/train_config_from_flags.h"
#include "tools/flags/training_flags.h"
#include "tools/serve/server.h"
#include "training/job.h"

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
                                "kv_cache_memory_fraction",
                                "batch_invariant",
                                "random_weights",
                                "cuda_graph",
                                "device",
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
                                "tokenizer_config",
                                "quantize",
                                "tokenizer_type",
                                "tokenizer_model",
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

// The model flags, taken with --random-weights only (a checkpoint brings
// its own model).
const std::set<std::string>& RandomModelFlags() {
  static const auto* flags =
      new std::set<std::string>{"num_layers",
                                "hidden_size",
                                "num_attention_heads",
                                "group_query_attention",
                                "num_query_groups",
                                "ffn_hidden_size",
                                "seq_length",
                                "max_position_embeddings",
                                "position_embedding_type",
                                "normalization",
                                "norm_epsilon",
                                "swiglu",
                                "untie_embeddings_and_output_weights",
                                "disable_bias_linear",
                                "add_qkv_bias",
                                "qk_layernorm",
                                "rotary_base",
                                "use_rope_scaling",
                                "rope_scaling_factor",
                                "vocab_size",
                                "seed"};
  return *flags;
}

// The serving the flags describe: --load relative to the workspace under
// `bazel run`, and --api-key from MCC_API_KEY when not given.
absl::StatusOr<inference::ServeConfig> ConfigFromFlags() {
  inference::ServeConfig config;
  MCC_RETURN_IF_ERROR(flags::FieldsFromFlags(&config));
  MCC_ASSIGN_OR_RETURN(*config.mutable_run(), flags::TrainConfigFromFlags());
  const std::string& dir = config.run().load();
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (!dir.empty() && dir[0] != '/' && workspace != nullptr) {
    config.mutable_run()->set_load(absl::StrCat(workspace, "/", dir));
  }
  // Never logged.
  if (config.api_key().empty()) {
    if (const char* env = std::getenv("MCC_API_KEY")) config.set_api_key(env);
  }
  return config;
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
  const bool random_weights = absl::GetFlag(FLAGS_random_weights);
  for (const std::string& flag : parsed->explicitly_set) {
    if (random_weights && mcc::serve::RandomModelFlags().count(flag) > 0) {
      continue;
    }
    if (mcc::serve::UsedFlags().count(flag) == 0) {
      std::fprintf(stderr,
                   "serve: --%s is not used by serve (the model comes from "
                   "the checkpoint; serve trains nothing)\n",
                   flag.c_str());
      return mcc::serve::kFlagError;
    }
  }
  auto config = mcc::serve::ConfigFromFlags();
  absl::Status checked = config.status();
  if (checked.ok()) checked = mcc::inference::CheckServeConfig(*config);
  if (checked.ok() && !config->tokenizer_config().empty()) {
    checked =
        mcc::data::ReadTokenizerConfig(config->tokenizer_config()).status();
    if (!checked.ok()) {
      checked = absl::InvalidArgumentError(
          absl::StrCat("--tokenizer-config: ", checked.message()));
    }
  }
  if (!checked.ok()) {
    std::fprintf(stderr, "serve: %s\n", std::string(checked.message()).c_str());
    return mcc::serve::kFlagError;
  }
  mcc::training::ConfigureThreads(config->run());
  if (absl::Status s = mcc::serve::RunServer(*config); !s.ok()) {
    LOG(ERROR) << "serve: " << s.message();
    return 1;
  }
  return 0;
}
