#include "tools/flags/training_flags.h"

#include <algorithm>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

ABSL_FLAG(int32_t, num_layers, 4, "Transformer layers.");
ABSL_FLAG(int64_t, hidden_size, 128, "Hidden size.");
ABSL_FLAG(int32_t, num_attention_heads, 4, "Attention heads.");
ABSL_FLAG(int32_t, num_query_groups, 0,
          "Key/value head groups with --group-query-attention (0: 1, as "
          "Megatron).");
ABSL_FLAG(bool, group_query_attention, false, "Grouped-query attention.");
ABSL_FLAG(int64_t, ffn_hidden_size, 0, "MLP hidden size (0: 4 x hidden).");
ABSL_FLAG(int64_t, seq_length, 128, "Sequence length.");
ABSL_FLAG(int64_t, max_position_embeddings, 0,
          "Position table size (0: --seq-length).");
ABSL_FLAG(std::string, position_embedding_type, "learned_absolute",
          "learned_absolute or rope.");
ABSL_FLAG(double, rotary_base, 10000.0, "Rotary embedding base.");
ABSL_FLAG(std::string, normalization, "LayerNorm", "LayerNorm or RMSNorm.");
ABSL_FLAG(double, norm_epsilon, 1e-5, "Normalization epsilon.");
ABSL_FLAG(bool, swiglu, false, "SwiGLU MLP instead of GELU.");
ABSL_FLAG(bool, untie_embeddings_and_output_weights, false,
          "Separate output layer weights.");
ABSL_FLAG(bool, disable_bias_linear, false, "No biases in linear layers.");
ABSL_FLAG(double, hidden_dropout, 0.0, "Dropout on hidden states.");
ABSL_FLAG(double, attention_dropout, 0.0,
          "Dropout on the attention probabilities.");
ABSL_FLAG(double, init_method_std, 0.02, "Weight init standard deviation.");
ABSL_FLAG(int64_t, vocab_size, 0,
          "Vocabulary size for --mock-data (0: the tokenizer's).");
ABSL_FLAG(int32_t, make_vocab_size_divisible_by, 128,
          "Pad the vocabulary to a multiple of this times TP (zero rows "
          "that take no probability and are not saved in checkpoints).");
ABSL_FLAG(std::string, recompute_granularity, "",
          "Activation recomputation: full or selective (empty: none).");
ABSL_FLAG(std::string, recompute_method, "uniform",
          "uniform or block (with --recompute-granularity full).");
ABSL_FLAG(int32_t, recompute_num_layers, 1,
          "Layers per recomputed chunk (uniform) or recomputed (block).");
ABSL_FLAG(bool, cpu_offloading, false,
          "Activation offloading: the activations the first "
          "--cpu-offloading-num-layers layers of each model chunk save for "
          "their backward wait in pinned host memory, moved on a side stream "
          "(on a device; refused on the CPU, where they live in host memory "
          "already).");
ABSL_FLAG(int32_t, cpu_offloading_num_layers, 0,
          "Layers whose activations --cpu-offloading moves, counted from "
          "each model chunk's first (0 to --num-layers).");
ABSL_FLAG(bool, cuda_graph, false,
          "CUDA graphs: after one eager warm-up micro-batch, capture one "
          "micro-batch's forward and backward and replay them for every "
          "later micro-batch of the same shapes (losses unchanged). For a "
          "whole model on one rank of a data-parallel group: no TP, PP, CP, "
          "dropout, --cpu-offloading, --overlap-grad-reduce or "
          "--overlap-param-gather (each refused, named).");
ABSL_FLAG(int32_t, seed, 1234, "Seed for initialisation, data and dropout.");
ABSL_FLAG(bool, bf16, false, "bf16 parameters and activations.");
ABSL_FLAG(bool, fp16, false, "fp16 training with a dynamic loss scaler.");

ABSL_FLAG(int32_t, tensor_model_parallel_size, 1, "Tensor-parallel size.");
ABSL_FLAG(int32_t, pipeline_model_parallel_size, 1, "Pipeline-parallel size.");
ABSL_FLAG(int32_t, num_layers_per_virtual_pipeline_stage, 0,
          "Layers per virtual pipeline stage: the interleaved 1F1B schedule "
          "(0: one chunk per stage).");
ABSL_FLAG(int32_t, decoder_first_pipeline_num_layers, 0,
          "Layers on the first pipeline stage (0: an even split).");
ABSL_FLAG(int32_t, decoder_last_pipeline_num_layers, 0,
          "Layers on the last pipeline stage (0: an even split).");
ABSL_FLAG(bool, no_overlap_p2p_communication, false,
          "Wait for each pipeline transfer instead of overlapping it with "
          "compute.");
ABSL_FLAG(double, distributed_timeout_minutes, 10,
          "Timeout of every collective, p2p transfer and rendezvous of the "
          "job's groups, in minutes (Megatron's flag; fractions allowed): a "
          "rank that died or stopped (SIGSTOP, a hung node) fails the others "
          "within it, naming the operation, and with --flight-recorder-dir "
          "tools/analyze_hang names the rank.");
ABSL_FLAG(int32_t, context_parallel_size, 1,
          "Context-parallel size: each sequence splits into 2 x this many "
          "chunks, rank i of the group holding chunks i and 2C-1-i.");
ABSL_FLAG(std::string, cp_comm_type, "p2p",
          "How attention crosses the context-parallel group: p2p (ring "
          "attention, K/V passed around the ring) or a2a (all-to-all over "
          "heads; heads must divide by the CP size).");
ABSL_FLAG(bool, sequence_parallel, false,
          "Split norm and dropout regions along the sequence over TP.");

ABSL_FLAG(std::string, data_path, "",
          "Data prefix, or weights and prefixes: '0.3 A 0.7 B'. Empty: the "
          "embedded default corpus.");
ABSL_FLAG(std::string, split, "969,30,1", "Train, valid, test split weights.");
ABSL_FLAG(bool, mock_data, false, "Synthetic tokens, no files.");
ABSL_FLAG(std::string, tokenizer_type, "ByteTokenizer",
          "ByteTokenizer, GPT2BPETokenizer, SentencePieceTokenizer or "
          "HuggingFaceTokenizer.");
ABSL_FLAG(std::string, vocab_file, "", "GPT-2 encoder.json.");
ABSL_FLAG(std::string, merge_file, "", "GPT-2 vocab.bpe.");
ABSL_FLAG(std::string, tokenizer_model, "",
          "SentencePiece .model (SentencePieceTokenizer) or tokenizer.json "
          "(HuggingFaceTokenizer).");
ABSL_FLAG(std::string, data_cache_path, "",
          "Where dataset indices are cached (default: beside the data).");
ABSL_FLAG(bool, eod_mask_loss, false, "No loss on end-of-document tokens.");
ABSL_FLAG(int32_t, micro_batch_size, 8, "Micro-batch size per DP rank.");

namespace mcc {
namespace flags {

absl::StatusOr<parallel::LayerContext::CpCommType> CpCommTypeFromFlags() {
  const std::string type = absl::GetFlag(FLAGS_cp_comm_type);
  if (type == "p2p") return parallel::LayerContext::CpCommType::kP2P;
  if (type == "a2a") return parallel::LayerContext::CpCommType::kAllToAll;
  return absl::InvalidArgumentError(
      absl::StrCat("--cp-comm-type: '", type, "' is not p2p or a2a"));
}

absl::StatusOr<gpt::GPTConfig> GPTConfigFromFlags(int64_t vocab_size) {
  gpt::GPTConfig c;
  c.num_layers = absl::GetFlag(FLAGS_num_layers);
  c.hidden_size = absl::GetFlag(FLAGS_hidden_size);
  c.num_attention_heads = absl::GetFlag(FLAGS_num_attention_heads);
  if (absl::GetFlag(FLAGS_group_query_attention)) {
    // Megatron's default is one group (multi-query attention).
    c.num_query_groups = std::max(1, absl::GetFlag(FLAGS_num_query_groups));
  }
  c.ffn_hidden_size = absl::GetFlag(FLAGS_ffn_hidden_size);
  c.seq_length = absl::GetFlag(FLAGS_seq_length);
  c.max_position_embeddings = absl::GetFlag(FLAGS_max_position_embeddings);
  const std::string pos = absl::GetFlag(FLAGS_position_embedding_type);
  if (pos == "rope") {
    c.position_embedding = gpt::PositionEmbedding::kRope;
  } else if (pos != "learned_absolute") {
    return absl::InvalidArgumentError(
        absl::StrCat("--position-embedding-type: '", pos,
                     "' is not learned_absolute or rope"));
  }
  c.rotary_base = absl::GetFlag(FLAGS_rotary_base);
  const std::string norm = absl::GetFlag(FLAGS_normalization);
  if (norm == "RMSNorm") {
    c.normalization = gpt::Normalization::kRMSNorm;
  } else if (norm != "LayerNorm") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--normalization: '", norm, "' is not LayerNorm or RMSNorm"));
  }
  c.norm_epsilon = absl::GetFlag(FLAGS_norm_epsilon);
  if (absl::GetFlag(FLAGS_swiglu)) c.activation = gpt::Activation::kSwiGLU;
  c.untie_embeddings_and_output_weights =
      absl::GetFlag(FLAGS_untie_embeddings_and_output_weights);
  c.add_bias_linear = !absl::GetFlag(FLAGS_disable_bias_linear);
  c.hidden_dropout = absl::GetFlag(FLAGS_hidden_dropout);
  c.attention_dropout = absl::GetFlag(FLAGS_attention_dropout);
  c.init_method_std = absl::GetFlag(FLAGS_init_method_std);
  c.vocab_size = vocab_size;
  // Padding for TP is the model's business (zero rows, no probability).
  c.make_vocab_size_divisible_by =
      absl::GetFlag(FLAGS_make_vocab_size_divisible_by);
  c.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  const std::string granularity = absl::GetFlag(FLAGS_recompute_granularity);
  if (granularity == "full") {
    c.recompute_granularity = gpt::RecomputeGranularity::kFull;
  } else if (granularity == "selective") {
    c.recompute_granularity = gpt::RecomputeGranularity::kSelective;
  } else if (!granularity.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--recompute-granularity: '", granularity,
                     "' is not full or selective"));
  }
  const std::string method = absl::GetFlag(FLAGS_recompute_method);
  if (method == "block") {
    c.recompute_method = gpt::RecomputeMethod::kBlock;
  } else if (method != "uniform") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recompute-method: '", method, "' is not uniform or block"));
  }
  c.recompute_num_layers = absl::GetFlag(FLAGS_recompute_num_layers);
  c.cpu_offloading = absl::GetFlag(FLAGS_cpu_offloading);
  c.cpu_offloading_num_layers = absl::GetFlag(FLAGS_cpu_offloading_num_layers);
  if (absl::GetFlag(FLAGS_bf16) && absl::GetFlag(FLAGS_fp16)) {
    return absl::InvalidArgumentError("--bf16 and --fp16 exclude each other");
  }
  if (absl::GetFlag(FLAGS_context_parallel_size) > 1) {
    const int64_t split = 2 * absl::GetFlag(FLAGS_context_parallel_size);
    if (c.seq_length % split != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--seq-length ", c.seq_length, " must divide into 2 x ",
                       "--context-parallel-size = ", split, " equal chunks"));
    }
    if (c.attention_dropout > 0) {
      return absl::InvalidArgumentError(
          "--context-parallel-size > 1 needs --attention-dropout 0");
    }
  }
  MCC_RETURN_IF_ERROR(CpCommTypeFromFlags().status());
  if (absl::Status s =
          c.Validate(absl::GetFlag(FLAGS_tensor_model_parallel_size),
                     absl::GetFlag(FLAGS_sequence_parallel));
      !s.ok()) {
    return s;
  }
  return c;
}

absl::StatusOr<pipeline::PipelineConfig> PipelineConfigFromFlags() {
  pipeline::PipelineConfig c;
  c.num_layers = absl::GetFlag(FLAGS_num_layers);
  c.pipeline_size = absl::GetFlag(FLAGS_pipeline_model_parallel_size);
  c.layers_per_virtual_stage =
      absl::GetFlag(FLAGS_num_layers_per_virtual_pipeline_stage);
  c.first_stage_layers = absl::GetFlag(FLAGS_decoder_first_pipeline_num_layers);
  c.last_stage_layers = absl::GetFlag(FLAGS_decoder_last_pipeline_num_layers);
  MCC_RETURN_IF_ERROR(pipeline::ValidatePipelineConfig(c));
  return c;
}

}  // namespace flags
}  // namespace mcc
