// tools/eval: a trained GPT from a checkpoint (--load DIR), with Megatron's
// flags. The model configuration comes from the checkpoint's metadata; the
// parallel layout from the flags and the launcher, so any layout can load
// any checkpoint.
//   evaluation: validation and test loss and perplexity over --eval-iters
//               micro-batches of --data-path (or the embedded corpus, or
//               --mock-data), split as tools/train splits it;
//   generation: --prompt TEXT continues the text through the inference
//               engine (inference/: paged KV cache, the same arithmetic under
//               every layout), greedily (--temperature 0) or by sampling
//               (--top-k, --top-p, --seed), stopping at the tokenizer's end
//               of document; --prompt-ids '1 5 9' starts from token ids
//               instead (and prints the prompt's next-token loss),
//               --output-ids prints the generated ids on one line: with
//               both, no tokenizer is read and generation runs the full
//               --max-new-tokens.
// Tensor and pipeline parallelism (and TP x PP) both work for either mode.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "data/tokenizer.h"
#include "glog/logging.h"
#include "tools/flags/checkpoint_flags.h"
#include "tools/flags/device_flag.h"
#include "tools/flags/eval_config_from_flags.h"
#include "tools/flags/eval_flags.h"
#include "tools/flags/megatron_args.h"
#include "tools/flags/quantize_flag.h"
#include "tools/flags/runtime_flags.h"
#include "tools/flags/training_flags.h"
#include "training/checkpoint_eval.h"
#include "training/job.h"

namespace mcc {
namespace tools {
namespace {

constexpr int kFlagError = 2;

// Training's flags that eval links but never reads: refused, so that a
// training command line reused for eval says what does not carry over.
std::vector<flags::UnusedFlag> RefusedFlags() {
  const std::string no_training =
      "eval does not train (no dropout, initialisation or recomputation)";
  const std::string no_pipeline =
      "eval splits the layers evenly over pipeline stages (no virtual or "
      "uneven stages)";
  const std::string no_saving = "eval saves nothing";
  const std::string no_moe =
      "eval's models have no MoE layers (expert parallelism and token "
      "dropping are training's)";
  return {
      {"hidden_dropout", true, no_training},
      {"attention_dropout", true, no_training},
      {"init_method_std", true, no_training},
      {"recompute_granularity", true, no_training},
      {"recompute_method", true, no_training},
      {"recompute_num_layers", true, no_training},
      {"cpu_offloading", true,
       "eval keeps no activations for a backward (nothing to offload)"},
      {"cpu_offloading_num_layers", true,
       "eval keeps no activations for a backward (nothing to offload)"},
      {"cuda_graph", true,
       "eval runs forwards of varying batches eagerly (nothing captured)"},
      {"num_layers_per_virtual_pipeline_stage", true, no_pipeline},
      {"decoder_first_pipeline_num_layers", true, no_pipeline},
      {"decoder_last_pipeline_num_layers", true, no_pipeline},
      {"no_overlap_p2p_communication", true,
       "eval's forward-only pipeline sends one tensor at a time (nothing to "
       "overlap)"},
      {"cp_comm_type", true, "eval runs without context parallelism"},
      {"expert_model_parallel_size", true, no_moe},
      {"expert_tensor_parallel_size", true, no_moe},
      {"moe_expert_capacity_factor", true, no_moe},
      {"moe_token_drop_policy", true, no_moe},
      {"moe_pack_expert_weights", true, no_moe},
      {"save", true, no_saving},
      {"save_interval", true, no_saving},
      {"async_save", true, no_saving},
      {"keep_last", true, no_saving},
      {"continue_on_save_failure", true, no_saving},
      {"no_load_optim", true, "eval loads no optimizer state"},
      {"no_load_rng", true,
       "eval loads no RNG state (--seed seeds sampling and mock data)"},
  };
}

// Flags that matter only in eval's other mode: each given one warns once.
std::vector<flags::UnusedFlag> IgnoredFlags(const training::EvalPlan& plan,
                                            int world_size) {
  const bool mock = plan.config.run().mock_data();
  const std::string needs_prompt = "it needs --prompt (generation)";
  const std::string no_evaluation =
      "no evaluation runs (--prompt without --eval-iters)";
  const std::string mock_why =
      "--mock-data draws tokens uniformly; no files are read";
  const bool greedy = plan.config.temperature() == 0;
  const bool no_tokenizer = plan.tokenizer == nullptr;
  const std::string no_text =
      plan.generate ? "--prompt-ids with --output-ids reads and writes no text"
                    : "--mock-data without --prompt reads no text";
  const bool bpe = plan.config.run().tokenizer_type() == "GPT2BPETokenizer";
  return {
      {"max_new_tokens", !plan.generate, needs_prompt},
      {"temperature", !plan.generate, needs_prompt},
      {"top_k", !plan.generate || greedy,
       plan.generate ? "--temperature 0 is greedy" : needs_prompt},
      {"top_p", !plan.generate || greedy,
       plan.generate ? "--temperature 0 is greedy" : needs_prompt},
      {"no_kv_cache", !plan.generate, needs_prompt},
      {"output_ids", !plan.generate, needs_prompt},
      {"data_path", !plan.evaluate || mock,
       plan.evaluate ? mock_why : no_evaluation},
      {"split", !plan.evaluate || mock,
       plan.evaluate ? mock_why : no_evaluation},
      {"data_cache_path", !plan.evaluate || mock,
       plan.evaluate ? mock_why : no_evaluation},
      {"eod_mask_loss", !plan.evaluate || mock,
       plan.evaluate ? mock_why : no_evaluation},
      {"reset_position_ids", !plan.evaluate || mock,
       plan.evaluate ? mock_why : no_evaluation},
      {"reset_attention_mask", !plan.evaluate || mock,
       plan.evaluate ? mock_why : no_evaluation},
      {"micro_batch_size", !plan.evaluate, no_evaluation},
      {"tokenizer_type", no_tokenizer, no_text},
      {"vocab_file", no_tokenizer || !bpe,
       no_tokenizer ? no_text : "only GPT2BPETokenizer reads it"},
      {"merge_file", no_tokenizer || !bpe,
       no_tokenizer ? no_text : "only GPT2BPETokenizer reads it"},
      {"tokenizer_model",
       no_tokenizer ||
           !data::TokenizerReadsFlag(plan.config.run().tokenizer_type(),
                                     "tokenizer_model"),
       no_tokenizer ? no_text
                    : "only SentencePieceTokenizer and HuggingFaceTokenizer "
                      "read it"},
      {"sequence_parallel", true,
       "eval runs without it (decoding one token cannot split the sequence; "
       "the weights are the same)"},
      {"debug_collectives", world_size == 1,
       "a single process makes no collectives"},
      {"distributed_timeout_minutes", world_size == 1,
       "a single process makes no collectives"},
  };
}

// The results, on stdout as eval always printed them.
void PrintResult(const training::EvalConfig& config,
                 const training::EvalResult& result) {
  for (const training::SplitLoss& split : result.splits) {
    if (split.empty) {
      std::printf("%s: empty split (--split %s)\n", split.split.c_str(),
                  config.run().split().c_str());
      continue;
    }
    std::printf("%s loss %.4f | perplexity %.2f\n", split.split.c_str(),
                split.loss, std::exp(std::min(split.loss, 20.0)));
    // All the digits, for layout comparisons.
    LOG(INFO) << absl::StrFormat("loss digits: %s %.9g", split.split,
                                 split.loss);
  }
  std::fflush(stdout);
  if (!result.generation.has_value()) return;
  const training::Generation& g = *result.generation;
  if (g.prompt_loss.has_value()) {
    std::printf("prompt loss: %.9g over %lld next-token predictions\n",
                *g.prompt_loss,
                static_cast<long long>(g.prompt_loss_predictions));
  }
  if (config.output_ids()) {
    std::printf("%s\n", absl::StrJoin(g.tokens, " ").c_str());
  } else {
    std::printf("prompt: %s\ncontinuation: %s\n",
                config.prompt_ids().empty() ? config.prompt().c_str()
                                            : config.prompt_ids().c_str(),
                g.text.c_str());
  }
  // With --output-ids stdout holds the ids alone.
  const std::string stats = absl::StrFormat(
      "generated %zu tokens (%s): prefill %d tokens in %.1f ms; decoding "
      "%.1f tokens/s (%s)",
      g.tokens.size(),
      g.stopped_at_eod ? "stopped at end of document" : "token limit",
      static_cast<int>(g.prompt_tokens), g.prefill_ms, g.decode_tokens_per_s,
      config.no_kv_cache() ? "full recompute, --no-kv-cache" : "KV cache");
  if (config.output_ids()) {
    LOG(INFO) << stats;
  } else {
    std::printf("%s\n", stats.c_str());
  }
  std::fflush(stdout);
}

// The evaluation the flags describe, --load relative to the workspace under
// `bazel run`.
absl::StatusOr<training::EvalConfig> ConfigFromFlags(
    const std::set<std::string>& explicitly_set) {
  MCC_RETURN_IF_ERROR(flags::RefuseUnusedFlags(RefusedFlags(), explicitly_set));
  MCC_ASSIGN_OR_RETURN(training::EvalConfig config,
                       flags::EvalConfigFromFlags(explicitly_set));
  const std::string& dir = config.run().load();
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (!dir.empty() && dir[0] != '/' && workspace != nullptr) {
    config.mutable_run()->set_load(absl::StrCat(workspace, "/", dir));
  }
  return config;
}

}  // namespace
}  // namespace tools
}  // namespace mcc

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  auto parsed = mcc::flags::ParseMegatronArgs(argc, argv, {"data_path"});
  if (!parsed.ok()) {
    std::fprintf(stderr, "eval: %s\n",
                 std::string(parsed.status().message()).c_str());
    return mcc::tools::kFlagError;
  }
  mcc::flags::ApplyRuntimeFlags();
  for (const std::string& arg : parsed->positional) {
    if (arg == "help" || arg == "-h") {
      std::printf(
          "usage: eval --load DIR [--prompt TEXT | --prompt-ids 'ID ...' "
          "[--output-ids]] [--flag value ...]\n%s\n",
          mcc::flags::Usage().c_str());
      return 0;
    }
  }
  if (!parsed->positional.empty()) {
    std::fprintf(stderr, "eval: unexpected argument '%s'\n",
                 parsed->positional[0].c_str());
    return mcc::tools::kFlagError;
  }
  const int world_size = mcc::training::WorldSizeFromEnvironment();
  auto config = mcc::tools::ConfigFromFlags(parsed->explicitly_set);
  absl::StatusOr<mcc::training::EvalPlan> plan =
      config.ok() ? mcc::training::PlanCheckpointEval(*config, world_size)
                  : absl::StatusOr<mcc::training::EvalPlan>(config.status());
  if (!plan.ok()) {
    std::fprintf(stderr, "eval: %s\n",
                 std::string(plan.status().message()).c_str());
    return mcc::tools::kFlagError;
  }
  if (mcc::training::IsFirstRank()) {
    for (const std::string& line : mcc::flags::UnusedFlagWarnings(
             mcc::tools::IgnoredFlags(*plan, world_size),
             parsed->explicitly_set)) {
      LOG(WARNING) << line;
    }
  }
  mcc::training::ConfigureThreads(config->run());
  auto result = mcc::training::EvaluateCheckpoint(*plan);
  if (!result.ok()) {
    LOG(ERROR) << "eval failed: " << result.status();
    return 1;
  }
  if (result->reported) mcc::tools::PrintResult(*config, *result);
  return 0;
}
