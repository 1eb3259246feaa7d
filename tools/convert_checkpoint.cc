// tools/convert_checkpoint: a checkpoint of any layout to a Hugging Face
// model directory (config.json and model.safetensors, or shards with
// model.safetensors.index.json) for GPT2LMHeadModel, LlamaForCausalLM,
// Qwen2ForCausalLM or Qwen3ForCausalLM,
// and back into a checkpoint that loads under any layout.
//
//   convert_checkpoint --load DIR --export-hf OUT_DIR [--max-shard-size 5GB]
//   convert_checkpoint --import-hf IN_DIR --save DIR
//   convert_checkpoint --load DIR --quantize int8 --save OUT_DIR
//
// --quantize int8 writes the weight-only int8 form of a checkpoint
// (models/gpt/int8_checkpoint_writer.h), which eval loads as int8 under any
// layout.
//
// Export picks the architecture from the checkpoint's model configuration
// (GPT-2: LayerNorm, GELU, learned positions, biases; Llama: RMSNorm,
// SwiGLU, RoPE, no biases; Qwen2: Llama with a QKV bias; Qwen3: Llama with
// QK-norm); import picks it
// from config.json's model_type.
//
// Checkpoints hold the true vocabulary (no TP padding), so the export does
// not depend on the layout a checkpoint was saved at, and an import loads
// under any layout and padding.
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/checkpoint_writer.h"
#include "checkpoint/dist_context.h"
#include "checkpoint/hf_common.h"
#include "checkpoint/hf_gpt2.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/safetensors.h"
#include "core/status_macros.h"
#include "glog/logging.h"
#include "models/gpt/int8_checkpoint_writer.h"
#include "nlohmann/json.hpp"
#include "tools/flags/megatron_args.h"

ABSL_FLAG(std::string, load, "", "Checkpoint directory to export.");
ABSL_FLAG(std::string, export_hf, "",
          "Write config.json and the weights for GPT2LMHeadModel, "
          "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM or "
          "Qwen3ForCausalLM (by the "
          "checkpoint's "
          "architecture) here.");
ABSL_FLAG(
    std::string, import_hf, "",
    "Read config.json (model_type gpt2, llama, mistral, qwen2 or qwen3) and "
    "model.safetensors "
    "or model.safetensors.index.json with its shards from here.");
ABSL_FLAG(std::string, max_shard_size, "5GB",
          "--export-hf: weights larger than this go into shards "
          "model-0000N-of-0000M.safetensors of at most this size (5GB, "
          "200MB, 64KB or bytes).");
ABSL_FLAG(std::string, save, "",
          "Checkpoint directory to write (import, --quantize).");
ABSL_FLAG(std::string, quantize, "",
          "int8: write --load's checkpoint to --save with the decoder's linear "
          "weights quantised to int8 per output channel (for eval).");

namespace mcc {
namespace tools {
namespace {

constexpr int kFlagError = 2;

std::string Gpt2ConfigJson(const checkpoint::ModelConfig& c) {
  const int64_t vocab =
      c.vocab_size() > 0 ? c.vocab_size() : c.padded_vocab_size();
  // ordered_json: the keys in Hugging Face's order; doubles round-trip.
  const nlohmann::ordered_json config = {
      {"architectures", nlohmann::ordered_json::array({"GPT2LMHeadModel"})},
      {"model_type", "gpt2"},
      {"vocab_size", vocab},
      {"n_positions", c.max_position_embeddings()},
      {"n_ctx", c.max_position_embeddings()},
      {"n_embd", c.hidden_size()},
      {"n_layer", c.num_layers()},
      {"n_head", c.num_attention_heads()},
      {"n_inner", c.ffn_hidden_size()},
      {"activation_function", "gelu_new"},
      {"layer_norm_epsilon", c.layernorm_epsilon()},
      {"tie_word_embeddings", c.tied_embeddings()},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"torch_dtype", "float32"},
  };
  return config.dump(2) + "\n";
}

absl::Status Export() {
  const std::string out = absl::GetFlag(FLAGS_export_hf);
  MCC_ASSIGN_OR_RETURN(const int64_t max_shard,
                       ParseByteSize(absl::GetFlag(FLAGS_max_shard_size)));
  MCC_ASSIGN_OR_RETURN(auto reader,
                       CheckpointReader::Open(absl::GetFlag(FLAGS_load)));
  const checkpoint::ModelConfig& config = reader->common_state().model();
  const absl::Status gpt2 = CheckGpt2Compatible(config);
  const absl::Status llama = CheckLlamaCompatible(config);
  if (!gpt2.ok() && !llama.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        reader->path(), ": ", gpt2.message(), " and ", llama.message()));
  }
  mkdir(out.c_str(), 0755);
  NamedTensors weights;
  std::string config_json;
  if (gpt2.ok()) {
    MCC_ASSIGN_OR_RETURN(weights, ExportCheckpointToGpt2Tensors(*reader));
    config_json = Gpt2ConfigJson(config);
  } else {
    MCC_ASSIGN_OR_RETURN(weights, ExportCheckpointToHfLlama(*reader));
    config_json = LlamaConfigJson(
        config, weights.empty() ? DType::kFloat32 : weights[0].second.dtype());
  }
  MCC_RETURN_IF_ERROR(
      WriteHfWeights(out, weights, max_shard,
                     {{"format", "pt"},
                      {"source", reader->path()},
                      {"iteration", absl::StrCat(reader->iteration())}}));
  MCC_RETURN_IF_ERROR(WriteTextFile(out + "/config.json", config_json));
  std::printf("exported %s (iteration %lld) as %s to %s\n",
              reader->path().c_str(),
              static_cast<long long>(reader->iteration()),
              gpt2.ok() ? "GPT2LMHeadModel" : HfArchitecture(config).c_str(),
              out.c_str());
  return absl::OkStatus();
}

absl::Status Import() {
  const std::string in = absl::GetFlag(FLAGS_import_hf);
  const std::string config_path = in + "/config.json";
  MCC_ASSIGN_OR_RETURN(JsonDocument json, ReadHfConfigJson(in));
  const std::string model_type =
      json.contains("model_type") && json["model_type"].is_string()
          ? json["model_type"].get<std::string>()
          : "gpt2";  // Older GPT-2 files have none.
  if (model_type != "gpt2" && model_type != "llama" &&
      model_type != "mistral" && model_type != "qwen2" &&
      model_type != "qwen3" && model_type != "mixtral" &&
      model_type != "qwen3_moe" && model_type != "qwen2_moe") {
    return absl::UnimplementedError(absl::StrCat(
        config_path, ": model_type \"", model_type,
        "\" is not gpt2, llama, mistral, qwen2, qwen3, mixtral or qwen3_moe"));
  }
  // Qwen2, Qwen3, Mixtral and Qwen3-MoE are the Llama mapping with their
  // extras (the Llama parser names what of qwen2_moe is not built).
  const bool llama = model_type != "gpt2";
  MCC_ASSIGN_OR_RETURN(checkpoint::ModelConfig config,
                       llama ? ParseLlamaConfigJson(json.dump(), config_path)
                             : ParseGpt2ConfigJson(json.dump(), config_path));
  MCC_ASSIGN_OR_RETURN(NamedTensors weights, ReadHfWeights(in));
  MCC_ASSIGN_OR_RETURN(auto params, llama ? ImportLlama(weights, config)
                                          : ImportGpt2(weights, config));
  std::vector<ShardedTensorRef> refs;
  for (auto& [name, tensor] : params) {
    refs.push_back(ShardedTensorRef::Replicated(name, tensor));
  }
  checkpoint::CommonState common;
  common.set_iteration(0);
  *common.mutable_model() = config;
  common.mutable_parallel()->set_tensor_model_parallel_size(1);
  common.mutable_parallel()->set_pipeline_model_parallel_size(1);
  common.mutable_parallel()->set_data_parallel_size(1);
  common.mutable_parallel()->set_world_size(1);
  checkpoint::RankState rank_state;
  MCC_RETURN_IF_ERROR(SaveCheckpoint(absl::GetFlag(FLAGS_save), 0, refs, common,
                                     rank_state, DistContext::Single()));
  std::printf("imported %s into %s (iteration 0, %zu tensors)\n", in.c_str(),
              absl::GetFlag(FLAGS_save).c_str(), refs.size());
  return absl::OkStatus();
}

absl::Status Quantize() {
  MCC_ASSIGN_OR_RETURN(auto reader,
                       CheckpointReader::Open(absl::GetFlag(FLAGS_load)));
  MCC_RETURN_IF_ERROR(
      gpt::WriteInt8Checkpoint(*reader, absl::GetFlag(FLAGS_save)));
  std::printf("quantised %s (iteration %lld) to int8 weights in %s\n",
              reader->path().c_str(),
              static_cast<long long>(reader->iteration()),
              absl::GetFlag(FLAGS_save).c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace tools
}  // namespace mcc

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  auto parsed = mcc::flags::ParseMegatronArgs(argc, argv);
  absl::Status flags_ok = parsed.status();
  if (flags_ok.ok() && !parsed->positional.empty()) {
    if (parsed->positional[0] == "help") {
      std::printf(
          "usage: convert_checkpoint --load DIR --export-hf OUT "
          "[--max-shard-size 5GB] | --import-hf IN --save DIR | --load DIR "
          "--quantize int8 --save OUT\n%s\n",
          mcc::flags::Usage().c_str());
      return 0;
    }
    flags_ok = absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", parsed->positional[0], "'"));
  }
  const bool exporting = !absl::GetFlag(FLAGS_export_hf).empty();
  const bool importing = !absl::GetFlag(FLAGS_import_hf).empty();
  const std::string quantize = absl::GetFlag(FLAGS_quantize);
  if (flags_ok.ok() && !quantize.empty()) {
    if (quantize != "int8") {
      flags_ok = absl::InvalidArgumentError(
          absl::StrCat("--quantize must be int8, got '", quantize, "'"));
    } else if (exporting || importing) {
      flags_ok = absl::InvalidArgumentError(
          "--quantize int8 rewrites a checkpoint (--load DIR --save OUT); "
          "it does not combine with --export-hf or --import-hf");
    } else if (absl::GetFlag(FLAGS_load).empty() ||
               absl::GetFlag(FLAGS_save).empty()) {
      flags_ok = absl::InvalidArgumentError(
          "--quantize int8 needs --load DIR and --save OUT");
    }
  } else if (flags_ok.ok() && exporting == importing) {
    flags_ok = absl::InvalidArgumentError(
        "give exactly one of --export-hf (with --load) or --import-hf (with "
        "--save)");
  } else if (flags_ok.ok() && exporting && absl::GetFlag(FLAGS_load).empty()) {
    flags_ok = absl::InvalidArgumentError("--export-hf needs --load DIR");
  } else if (flags_ok.ok() && importing && absl::GetFlag(FLAGS_save).empty()) {
    flags_ok = absl::InvalidArgumentError("--import-hf needs --save DIR");
  } else if (flags_ok.ok()) {
    // Each direction reads one of --load and --save.
    flags_ok = mcc::flags::RefuseUnusedFlags(
        {{"save", exporting, "--export-hf writes to its own directory"},
         {"load", importing, "--import-hf reads from its own directory"},
         {"max_shard_size", importing,
          "--import-hf reads whatever shards the index names"}},
        parsed->explicitly_set);
  }
  if (!flags_ok.ok()) {
    std::fprintf(stderr, "convert_checkpoint: %s\n",
                 std::string(flags_ok.message()).c_str());
    return mcc::tools::kFlagError;
  }
  absl::Status s = !quantize.empty() ? mcc::tools::Quantize()
                   : exporting       ? mcc::tools::Export()
                                     : mcc::tools::Import();
  if (!s.ok()) {
    std::fprintf(stderr, "convert_checkpoint: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
