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
#include <memory>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/sharded_tensor.h"
#include "core/comm/env.h"
#include "core/status_macros.h"
#include "data/blended_dataset.h"
#include "data/loader.h"
#include "data/tokenizer.h"
#include "glog/logging.h"
#include "inference/checkpoint_weights.h"
#include "inference/distributed_step.h"
#include "inference/engine.h"
#include "inference/inference_weights.h"
#include "inference/model_runner.h"
#include "models/gpt/model_config_proto.h"
#include "parallel/mappings.h"
#include "parallel/pipeline/layer_split.h"
#include "parallel/pipeline/pipeline_executor.h"
#include "parallel/rank_layout.h"
#include "tools/flags/checkpoint_flags.h"
#include "tools/flags/device_flag.h"
#include "tools/flags/megatron_args.h"
#include "tools/flags/quantize_flag.h"
#include "tools/flags/runtime_flags.h"
#include "tools/flags/train_config_from_flags.h"
#include "tools/flags/training_flags.h"
#include "training/checkpointing.h"
#include "training/device_choice.h"
#include "training/evaluation.h"
#include "training/job.h"
#include "training/trainer.h"

// Defined with the process groups (core/comm).
ABSL_DECLARE_FLAG(bool, debug_collectives);

ABSL_FLAG(int32_t, eval_iters, 10,
          "Micro-batches of the valid and test splits to evaluate (with "
          "--prompt: only when given).");
ABSL_FLAG(std::string, prompt, "", "Text to continue (generation mode).");
ABSL_FLAG(std::string, prompt_ids, "",
          "Token ids to continue, e.g. '1 5 9' (generation mode, bypassing "
          "the tokenizer); also prints the prompt's next-token loss.");
ABSL_FLAG(bool, output_ids, false,
          "Print the generated token ids on one line instead of text.");
ABSL_FLAG(int32_t, max_new_tokens, 64, "Tokens to generate at most.");
ABSL_FLAG(double, temperature, 1.0,
          "Sampling temperature; 0 is greedy (the most likely token).");
ABSL_FLAG(int32_t, top_k, 0, "Sample among the k most likely tokens (0: all).");
ABSL_FLAG(double, top_p, 0.0,
          "Sample among the most likely tokens whose probabilities sum to p "
          "(0: all).");
ABSL_FLAG(bool, no_kv_cache, false,
          "Recompute the whole prefix for every new token (for comparison).");

namespace mcc {
namespace tools {

// The run's pieces eval shares with training (//training).
using gpt::CheckConfigFitsCheckpoint;
using gpt::FromProto;
using training::CheckDevice;
using training::ChooseDevice;
using training::DeviceChoice;
using training::IsFirstRank;
using training::Job;
using training::WorldSizeFromEnvironment;
namespace {

constexpr int kFlagError = 2;

// What the checks before any process group forms find out.
struct Plan {
  std::string load_dir;
  checkpoint::ModelConfig stored;
  std::string checkpoint_path;  // DIR/iter_N
  gpt::GPTConfig config;
  DType dtype = DType::kFloat32;
  // For --prompt, text output and text data; null with --prompt-ids
  // --output-ids and --mock-data (or no evaluation).
  std::unique_ptr<data::Tokenizer> tokenizer;
  bool ids_in = false;  // --prompt-ids
  std::vector<int64_t> prompt_ids;
  int64_t max_new_tokens = 0;
  bool evaluate = false;
  bool generate = false;
};

// --load, relative to the workspace under `bazel run`.
std::string LoadDir() {
  std::string dir = absl::GetFlag(FLAGS_load);
  const char* workspace = std::getenv("BUILD_WORKSPACE_DIRECTORY");
  if (!dir.empty() && dir[0] != '/' && workspace != nullptr) {
    dir = absl::StrCat(workspace, "/", dir);
  }
  return dir;
}

std::string Dashed(const std::string& name) {
  return absl::StrReplaceAll(name, {{"_", "-"}});
}

// Every model flag given on the command line must agree with the
// checkpoint; the message names each flag and both values.
absl::Status CheckModelFlags(const Plan& plan,
                             const std::set<std::string>& explicitly_set) {
  const checkpoint::ModelConfig& m = plan.stored;
  std::vector<std::string> errors;
  auto check = [&](const std::string& flag, const std::string& field,
                   const std::string& given, const std::string& stored) {
    if (explicitly_set.count(flag) == 0 || given == stored) return;
    errors.push_back(absl::StrCat("--", Dashed(flag), " ", given,
                                  " disagrees with the checkpoint's ", field,
                                  " ", stored));
  };
  auto str = [](auto v) { return absl::StrCat(v); };
  auto boolean = [](bool v) { return std::string(v ? "true" : "false"); };
  check("num_layers", "num_layers", str(absl::GetFlag(FLAGS_num_layers)),
        str(m.num_layers()));
  check("hidden_size", "hidden_size", str(absl::GetFlag(FLAGS_hidden_size)),
        str(m.hidden_size()));
  check("num_attention_heads", "num_attention_heads",
        str(absl::GetFlag(FLAGS_num_attention_heads)),
        str(m.num_attention_heads()));
  check("group_query_attention", "num_query_groups < num_attention_heads",
        boolean(absl::GetFlag(FLAGS_group_query_attention)),
        boolean(m.num_query_groups() > 0 &&
                m.num_query_groups() < m.num_attention_heads()));
  check("num_query_groups", "num_query_groups",
        str(absl::GetFlag(FLAGS_num_query_groups)), str(m.num_query_groups()));
  if (absl::GetFlag(FLAGS_ffn_hidden_size) > 0) {
    check("ffn_hidden_size", "ffn_hidden_size",
          str(absl::GetFlag(FLAGS_ffn_hidden_size)), str(m.ffn_hidden_size()));
  }
  check("seq_length", "seq_length", str(absl::GetFlag(FLAGS_seq_length)),
        str(m.seq_length()));
  if (absl::GetFlag(FLAGS_max_position_embeddings) > 0) {
    check("max_position_embeddings", "max_position_embeddings",
          str(absl::GetFlag(FLAGS_max_position_embeddings)),
          str(m.max_position_embeddings()));
  }
  check("position_embedding_type", "position_embedding_type",
        absl::GetFlag(FLAGS_position_embedding_type),
        m.position_embedding_type() == checkpoint::POSITION_EMBEDDING_ROPE
            ? "rope"
            : "learned_absolute");
  check("rotary_base", "rotary_base", str(absl::GetFlag(FLAGS_rotary_base)),
        str(m.rotary_base()));
  const bool scaled = m.has_rope_scaling();
  check("use_rope_scaling", "rope_scaling",
        boolean(absl::GetFlag(FLAGS_use_rope_scaling)), boolean(scaled));
  check("rope_scaling_factor", "rope_scaling.factor",
        str(absl::GetFlag(FLAGS_rope_scaling_factor)),
        scaled ? str(m.rope_scaling().factor()) : "none");
  check("rope_scaling_low_freq_factor", "rope_scaling.low_freq_factor",
        str(absl::GetFlag(FLAGS_rope_scaling_low_freq_factor)),
        scaled ? str(m.rope_scaling().low_freq_factor()) : "none");
  check("rope_scaling_high_freq_factor", "rope_scaling.high_freq_factor",
        str(absl::GetFlag(FLAGS_rope_scaling_high_freq_factor)),
        scaled ? str(m.rope_scaling().high_freq_factor()) : "none");
  check("rope_scaling_original_max_position_embeddings",
        "rope_scaling.original_max_position_embeddings",
        str(absl::GetFlag(FLAGS_rope_scaling_original_max_position_embeddings)),
        scaled ? str(m.rope_scaling().original_max_position_embeddings())
               : "none");
  check("normalization", "normalization", absl::GetFlag(FLAGS_normalization),
        m.normalization() == checkpoint::NORMALIZATION_RMS_NORM ? "RMSNorm"
                                                                : "LayerNorm");
  check("norm_epsilon", "layernorm_epsilon",
        str(absl::GetFlag(FLAGS_norm_epsilon)), str(m.layernorm_epsilon()));
  check("swiglu", "activation", boolean(absl::GetFlag(FLAGS_swiglu)),
        boolean(m.activation() == checkpoint::ACTIVATION_SWIGLU));
  check("untie_embeddings_and_output_weights", "tied_embeddings (negated)",
        boolean(absl::GetFlag(FLAGS_untie_embeddings_and_output_weights)),
        boolean(!m.tied_embeddings()));
  check("disable_bias_linear", "add_bias_linear (negated)",
        boolean(absl::GetFlag(FLAGS_disable_bias_linear)),
        boolean(!m.add_bias_linear()));
  check("qk_layernorm", "qk_layernorm",
        boolean(absl::GetFlag(FLAGS_qk_layernorm)), boolean(m.qk_layernorm()));
  check("add_qkv_bias", "add_qkv_bias",
        boolean(absl::GetFlag(FLAGS_add_qkv_bias)), boolean(m.add_qkv_bias()));
  check("vocab_size", "vocab_size", str(absl::GetFlag(FLAGS_vocab_size)),
        str(m.vocab_size()));
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      absl::StrJoin(errors, "; "), " (", plan.checkpoint_path,
      "); eval takes the model configuration from the checkpoint"));
}

// Training's flags that eval links but never reads: refused, so that a
// training command line reused for eval says what does not carry over.
std::vector<flags::UnusedFlag> RefusedFlags() {
  const std::string no_training =
      "eval does not train (no dropout, initialisation or recomputation)";
  const std::string no_pipeline =
      "eval splits the layers evenly over pipeline stages (no virtual or "
      "uneven stages)";
  const std::string no_saving = "eval saves nothing";
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
std::vector<flags::UnusedFlag> IgnoredFlags(const Plan& plan, int world_size) {
  const bool mock = absl::GetFlag(FLAGS_mock_data);
  const std::string needs_prompt = "it needs --prompt (generation)";
  const std::string no_evaluation =
      "no evaluation runs (--prompt without --eval-iters)";
  const std::string mock_why =
      "--mock-data draws tokens uniformly; no files are read";
  const bool greedy = absl::GetFlag(FLAGS_temperature) == 0;
  const bool no_tokenizer = plan.tokenizer == nullptr;
  const std::string no_text =
      plan.generate ? "--prompt-ids with --output-ids reads and writes no text"
                    : "--mock-data without --prompt reads no text";
  const bool bpe = absl::GetFlag(FLAGS_tokenizer_type) == "GPT2BPETokenizer";
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
      {"micro_batch_size", !plan.evaluate, no_evaluation},
      {"tokenizer_type", no_tokenizer, no_text},
      {"vocab_file", no_tokenizer || !bpe,
       no_tokenizer ? no_text : "only GPT2BPETokenizer reads it"},
      {"merge_file", no_tokenizer || !bpe,
       no_tokenizer ? no_text : "only GPT2BPETokenizer reads it"},
      {"tokenizer_model",
       no_tokenizer ||
           !data::TokenizerReadsFlag(absl::GetFlag(FLAGS_tokenizer_type),
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

// Every check that needs no process group; errors are flag errors.
absl::StatusOr<Plan> PlanFromFlags(
    int world_size, const std::set<std::string>& explicitly_set) {
  MCC_RETURN_IF_ERROR(flags::RefuseUnusedFlags(RefusedFlags(), explicitly_set));
  MCC_RETURN_IF_ERROR(CheckDevice(absl::GetFlag(FLAGS_device)));
  MCC_ASSIGN_OR_RETURN(const training::TrainConfig train_config,
                       flags::TrainConfigFromFlags());
  MCC_RETURN_IF_ERROR(
      training::DistributedTimeoutFromConfig(train_config).status());
  Plan plan;
  plan.load_dir = LoadDir();
  if (plan.load_dir.empty()) {
    return absl::InvalidArgumentError(
        "--load DIR is required: the checkpoint directory to evaluate");
  }
  auto reader = CheckpointReader::Open(plan.load_dir);
  if (!reader.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--load ", plan.load_dir, ": ", reader.status().message()));
  }
  plan.stored = (*reader)->common_state().model();
  plan.checkpoint_path = (*reader)->path();
  MCC_RETURN_IF_ERROR(CheckModelFlags(plan, explicitly_set));
  MCC_ASSIGN_OR_RETURN(plan.config, FromProto(plan.stored));
  MCC_ASSIGN_OR_RETURN(const int64_t checkpoint_bytes,
                       (*reader)->ShardFileBytes());
  MCC_RETURN_IF_ERROR(CheckConfigFitsCheckpoint(plan.config, checkpoint_bytes,
                                                plan.checkpoint_path));
  plan.config.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  // The padding is this layout's (it never changes the logits).
  plan.config.make_vocab_size_divisible_by =
      absl::GetFlag(FLAGS_make_vocab_size_divisible_by);

  const int tp = absl::GetFlag(FLAGS_tensor_model_parallel_size);
  MCC_RETURN_IF_ERROR(
      parallel::RankLayout::Create(
          world_size, {tp, absl::GetFlag(FLAGS_pipeline_model_parallel_size),
                       absl::GetFlag(FLAGS_context_parallel_size)})
          .status());
  if (absl::GetFlag(FLAGS_context_parallel_size) != 1) {
    return absl::UnimplementedError(
        "--context-parallel-size must be 1: eval runs tensor, pipeline and "
        "data parallelism");
  }
  {
    pipeline::PipelineConfig split;
    split.num_layers = plan.config.num_layers;
    split.pipeline_size = absl::GetFlag(FLAGS_pipeline_model_parallel_size);
    if (absl::Status s = pipeline::ValidatePipelineConfig(split); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(plan.checkpoint_path, "'s ", plan.config.num_layers,
                       " layers: ", s.message()));
    }
  }
  if (absl::Status s = plan.config.Validate(tp, /*sequence_parallel=*/false);
      !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor-model-parallel-size ", tp, " cannot hold ",
                     plan.checkpoint_path, "'s model: ", s.message()));
  }
  // Parameters in the checkpoint's dtype unless --bf16 or --fp16 says
  // otherwise (either set to false: fp32).
  plan.dtype = static_cast<DType>(plan.stored.params_dtype());
  if (explicitly_set.count("bf16") || explicitly_set.count("fp16")) {
    plan.dtype = absl::GetFlag(FLAGS_bf16)   ? DType::kBFloat16
                 : absl::GetFlag(FLAGS_fp16) ? DType::kFloat16
                                             : DType::kFloat32;
  }
  if (plan.dtype != DType::kFloat32 && plan.dtype != DType::kBFloat16 &&
      plan.dtype != DType::kFloat16) {
    plan.dtype = DType::kFloat32;
  }
  if (absl::GetFlag(FLAGS_micro_batch_size) <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--micro-batch-size must be positive, got ",
                     absl::GetFlag(FLAGS_micro_batch_size)));
  }

  plan.ids_in = !absl::GetFlag(FLAGS_prompt_ids).empty();
  if (plan.ids_in && !absl::GetFlag(FLAGS_prompt).empty()) {
    return absl::InvalidArgumentError(
        "--prompt and --prompt-ids exclude each other: give the prompt as "
        "text or as token ids");
  }
  plan.generate = plan.ids_in || !absl::GetFlag(FLAGS_prompt).empty();
  plan.evaluate = plan.generate ? explicitly_set.count("eval_iters") > 0 &&
                                      absl::GetFlag(FLAGS_eval_iters) > 0
                                : absl::GetFlag(FLAGS_eval_iters) > 0;
  if (!plan.generate && !plan.evaluate) {
    return absl::InvalidArgumentError(
        "nothing to do: give --prompt TEXT, --prompt-ids IDS or a positive "
        "--eval-iters");
  }
  if (absl::GetFlag(FLAGS_eval_iters) < 0) {
    return absl::InvalidArgumentError("--eval-iters must not be negative");
  }
  if (plan.evaluate && !absl::GetFlag(FLAGS_mock_data)) {
    const std::string path = absl::GetFlag(FLAGS_data_path);
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
    MCC_RETURN_IF_ERROR(data::ParseSplit(absl::GetFlag(FLAGS_split)).status());
  }
  const bool text_out = plan.generate && !absl::GetFlag(FLAGS_output_ids);
  const bool text_in = plan.generate && !plan.ids_in;
  if (text_in || text_out ||
      (plan.evaluate && !absl::GetFlag(FLAGS_mock_data))) {
    MCC_ASSIGN_OR_RETURN(
        plan.tokenizer,
        data::CreateTokenizer(
            absl::GetFlag(FLAGS_tokenizer_type),
            data::TokenizerFiles{absl::GetFlag(FLAGS_vocab_file),
                                 absl::GetFlag(FLAGS_merge_file),
                                 absl::GetFlag(FLAGS_tokenizer_model)}));
    if (plan.tokenizer->vocab_size() > plan.config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tokenizer-type ", plan.tokenizer->name(), " has ",
          plan.tokenizer->vocab_size(), " tokens but ", plan.checkpoint_path,
          " was trained with a vocabulary of ", plan.config.vocab_size));
    }
  }
  if (plan.generate) {
    const double temperature = absl::GetFlag(FLAGS_temperature);
    const double top_p = absl::GetFlag(FLAGS_top_p);
    if (temperature < 0 || !std::isfinite(temperature)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--temperature must be >= 0, got ", temperature));
    }
    if (absl::GetFlag(FLAGS_top_k) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--top-k must be >= 0, got ", absl::GetFlag(FLAGS_top_k)));
    }
    if (top_p < 0 || top_p > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--top-p must be in [0, 1], got ", top_p));
    }
    if (absl::GetFlag(FLAGS_max_new_tokens) <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--max-new-tokens must be positive, got ",
                       absl::GetFlag(FLAGS_max_new_tokens)));
    }
    if (plan.ids_in) {
      MCC_ASSIGN_OR_RETURN(
          plan.prompt_ids,
          ParsePromptIds(absl::GetFlag(FLAGS_prompt_ids), plan.config));
    } else {
      std::vector<int32_t> ids;
      plan.tokenizer->Encode(absl::GetFlag(FLAGS_prompt), &ids);
      plan.prompt_ids.assign(ids.begin(), ids.end());
    }
    // The model was trained on positions [0, max_positions).
    const int64_t room = plan.config.max_positions();
    if (static_cast<int64_t>(plan.prompt_ids.size()) >= room) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prompt is ", plan.prompt_ids.size(), " tokens; the model (",
          plan.checkpoint_path, ") holds ", room, " positions, so at most ",
          room - 1, " leave room to generate"));
    }
    plan.max_new_tokens =
        std::min<int64_t>(absl::GetFlag(FLAGS_max_new_tokens),
                          room - static_cast<int64_t>(plan.prompt_ids.size()));
    if (plan.max_new_tokens < absl::GetFlag(FLAGS_max_new_tokens)) {
      LOG(WARNING) << "--max-new-tokens " << absl::GetFlag(FLAGS_max_new_tokens)
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
absl::StatusOr<std::unique_ptr<Job>> SetupEvalJob(const Plan& plan) {
  auto job = std::make_unique<Job>();
  MCC_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(plan.load_dir));
  MCC_ASSIGN_OR_RETURN(DeviceChoice device,
                       ChooseDevice(absl::GetFlag(FLAGS_device)));
  // The inference engine (generation) and the int8 GEMM have CPU kernels
  // only: those runs stay on the host.
  const auto& extra = reader->common_state().extra();
  const auto quantization = extra.find("quantization");
  const bool int8 =
      !absl::GetFlag(FLAGS_quantize).empty() ||
      (quantization != extra.end() && quantization->second == "int8");
  if (!device.device.is_cpu() && (plan.generate || int8)) {
    device = {Device::CPU(),
              absl::StrCat(device.reason, "; but ",
                           plan.generate ? "generation (the inference engine)"
                                         : "int8 weights",
                           " run on the CPU only, so this run does")};
  }
  MCC_ASSIGN_OR_RETURN(const training::TrainConfig train_config,
                       flags::TrainConfigFromFlags());
  MCC_RETURN_IF_ERROR(
      training::JoinWorld(train_config, job.get(), std::move(device)));
  if (job->world.has_value() && job->is_logging_rank() &&
      job->world->group->options().debug_collectives) {
    LOG(INFO) << "every collective's fingerprint checked";
  }
  if (plan.tokenizer != nullptr) job->tokenizer = plan.tokenizer->Clone();
  job->vocab_size = plan.stored.vocab_size();
  job->config = plan.config;
  job->context.tp_group = job->tp();
  // Decoding one token cannot split the sequence; the weights are the same
  // (--sequence-parallel warns).
  job->context.sequence_parallel = false;
  job->context.dtype = plan.dtype;
  job->context.seed = job->config.seed;
  job->context.device = job->device.device;
  job->pipeline.num_layers = job->config.num_layers;
  job->pipeline.pipeline_size =
      absl::GetFlag(FLAGS_pipeline_model_parallel_size);
  MCC_ASSIGN_OR_RETURN(job->model,
                       gpt::StageModel::Create(job->config, job->context,
                                               job->pipeline, job->pp_rank()));
  // The weights: this rank's box of every global tensor (whatever padding
  // the checkpoint's or this layout's vocabulary has).
  MCC_RETURN_IF_ERROR(inference::LoadCheckpointWeights(
      *reader, job->model->chunks(), absl::GetFlag(FLAGS_quantize),
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
absl::StatusOr<double> Evaluate(Job& job, data::DataLoader* loader, int iters) {
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

absl::Status RunEvaluation(Job& job) {
  const int iters = absl::GetFlag(FLAGS_eval_iters);
  const int64_t mbs = absl::GetFlag(FLAGS_micro_batch_size);
  const int64_t samples = static_cast<int64_t>(iters) * mbs * job.dp_size();
  MCC_ASSIGN_OR_RETURN(const training::TrainConfig train_config,
                       flags::TrainConfigFromFlags());
  MCC_ASSIGN_OR_RETURN(
      auto datasets,
      training::BuildDatasets(train_config, job, {1, samples, samples}));
  data::LoaderConfig loader_config;
  loader_config.micro_batch_size = mbs;
  loader_config.dp_rank = job.dp_rank();
  loader_config.dp_size = job.dp_size();
  if (job.tokenizer != nullptr) {
    loader_config.eod = job.tokenizer->eod();
    loader_config.eod_mask_loss = absl::GetFlag(FLAGS_eod_mask_loss);
  }
  const char* names[] = {"", "validation", "test"};
  for (int split : {1, 2}) {
    if (datasets[split] == nullptr) {
      if (job.is_logging_rank()) {
        std::printf("%s: empty split (--split %s)\n", names[split],
                    absl::GetFlag(FLAGS_split).c_str());
      }
      continue;
    }
    MCC_ASSIGN_OR_RETURN(
        auto loader, data::DataLoader::Create(datasets[split], loader_config));
    const absl::Time start = absl::Now();
    MCC_ASSIGN_OR_RETURN(double loss, Evaluate(job, loader.get(), iters));
    if (job.is_logging_rank()) {
      LOG(INFO) << absl::StrFormat("%s: %d micro-batches of %d in %.2f s",
                                   names[split], iters, mbs,
                                   absl::ToDoubleSeconds(absl::Now() - start));
      std::printf("%s loss %.4f | perplexity %.2f\n", names[split], loss,
                  std::exp(std::min(loss, 20.0)));
      // All the digits, for layout comparisons.
      LOG(INFO) << absl::StrFormat("loss digits: %s %.9g", names[split], loss);
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

absl::Status RunGeneration(Job& job, const Plan& plan) {
  const bool use_cache = !absl::GetFlag(FLAGS_no_kv_cache);
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
  inference::PagedKvCache cache = inference::PagedKvCache::WithBlocks(
      shape, (prompt_len + plan.max_new_tokens + shape.block_size - 1) /
                 shape.block_size);
  inference::ModelRunner runner(std::move(weights), job.tp(), std::move(cache));
  inference::StageLayout layout;
  layout.world = job.world.has_value() ? job.world->group.get() : nullptr;
  layout.pipeline = job.pp();
  layout.pp_rank = job.pp_rank();
  layout.pp_size = absl::GetFlag(FLAGS_pipeline_model_parallel_size);
  layout.tp_rank = parallel::GroupRank(job.tp());
  if (job.rank != 0) return inference::FollowSteps(&runner, layout);
  std::unique_ptr<inference::StepExecutor> executor =
      inference::MakeStepExecutor(&runner, layout);
  inference::EngineOptions options;
  options.scheduler.max_batch_size = 1;
  options.scheduler.prefill_chunk_size = prompt_len;  // One prefill step.
  // --no-kv-cache: every token recomputes the whole prefix (for comparison).
  options.scheduler.recompute_prefix = !use_cache;
  options.max_positions = job.config.max_positions();
  options.model_vocab = job.config.vocab_size;
  inference::Engine engine(options, executor.get(), &runner.cache(),
                           plan.tokenizer ? plan.tokenizer->Clone() : nullptr);
  inference::GenerationRequest request;
  request.prompt = prompt;
  request.prompt_logprobs = prompt_loss;
  request.max_new_tokens = plan.max_new_tokens;
  request.sampling.temperature = absl::GetFlag(FLAGS_temperature);
  request.sampling.top_k = absl::GetFlag(FLAGS_top_k);
  request.sampling.top_p = absl::GetFlag(FLAGS_top_p);
  request.sampling.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  absl::Time prefilled = start;
  MCC_ASSIGN_OR_RETURN(
      const inference::GenerationEvent result,
      inference::GenerateOne(&engine, std::move(request), &prefilled));
  MCC_RETURN_IF_ERROR(executor->Shutdown());
  const std::vector<int64_t>& generated = result.tokens;
  const std::vector<double>& prompt_logprobs = result.prompt_logprobs;
  const bool stopped_at_eod =
      result.finish_reason == inference::FinishReason::kStop;
  const absl::Time done_at = absl::Now();
  if (!job.is_logging_rank()) return absl::OkStatus();
  const int64_t decode_steps =
      std::max<int64_t>(0, static_cast<int64_t>(generated.size()) - 1);
  const double decode_s = absl::ToDoubleSeconds(done_at - prefilled);
  if (prompt_loss && !prompt_logprobs.empty()) {
    const double sum =
        std::accumulate(prompt_logprobs.begin(), prompt_logprobs.end(), 0.0);
    std::printf("prompt loss: %.9g over %zu next-token predictions\n",
                -sum / prompt_logprobs.size(), prompt_logprobs.size());
  }
  if (absl::GetFlag(FLAGS_output_ids)) {
    std::printf("%s\n", absl::StrJoin(generated, " ").c_str());
  } else {
    MCC_ASSIGN_OR_RETURN(std::string text, plan.tokenizer->Decode(
                                               absl::MakeConstSpan(generated)));
    std::printf("prompt: %s\ncontinuation: %s\n",
                plan.ids_in ? absl::GetFlag(FLAGS_prompt_ids).c_str()
                            : absl::GetFlag(FLAGS_prompt).c_str(),
                text.c_str());
  }
  // With --output-ids stdout holds the ids alone.
  const std::string stats = absl::StrFormat(
      "generated %zu tokens (%s): prefill %d tokens in %.1f ms; decoding "
      "%.1f tokens/s (%s)",
      generated.size(),
      stopped_at_eod ? "stopped at end of document" : "token limit",
      static_cast<int>(prompt_len),
      absl::ToDoubleMilliseconds(prefilled - start),
      decode_steps > 0 && decode_s > 0 ? decode_steps / decode_s : 0.0,
      use_cache ? "KV cache" : "full recompute, --no-kv-cache");
  if (absl::GetFlag(FLAGS_output_ids)) {
    LOG(INFO) << stats;
  } else {
    std::printf("%s\n", stats.c_str());
  }
  std::fflush(stdout);
  return absl::OkStatus();
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
  auto plan = mcc::tools::PlanFromFlags(mcc::tools::WorldSizeFromEnvironment(),
                                        parsed->explicitly_set);
  if (!plan.ok()) {
    std::fprintf(stderr, "eval: %s\n",
                 std::string(plan.status().message()).c_str());
    return mcc::tools::kFlagError;
  }
  if (mcc::tools::IsFirstRank()) {
    for (const std::string& line : mcc::flags::UnusedFlagWarnings(
             mcc::tools::IgnoredFlags(*plan,
                                      mcc::tools::WorldSizeFromEnvironment()),
             parsed->explicitly_set)) {
      LOG(WARNING) << line;
    }
  }
  mcc::training::ConfigureThreads(mcc::flags::TrainConfigFromFlags().value_or(
      mcc::training::TrainConfig()));
  auto job = mcc::tools::SetupEvalJob(*plan);
  absl::Status status = job.status();
  if (status.ok() && plan->evaluate) {
    status = mcc::tools::RunEvaluation(**job);
  }
  if (status.ok() && plan->generate) {
    status = mcc::tools::RunGeneration(**job, *plan);
  }
  if (status.ok()) status = (*job)->Barrier();
  if (!status.ok()) {
    LOG(ERROR) << "eval failed: " << status;
    return 1;
  }
  return 0;
}
