#include "tools/flags/training_flags.h"

#include "absl/flags/flag.h"

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
ABSL_FLAG(bool, use_rope_scaling, false,
          "Llama 3.x's rescaling of the rotary frequencies (Hugging Face's "
          "rope_scaling of type llama3), with --rope-scaling-factor.");
ABSL_FLAG(double, rope_scaling_factor, 8.0,
          "With --use-rope-scaling: the factor low frequencies are divided "
          "by.");
ABSL_FLAG(double, rope_scaling_low_freq_factor, 1.0,
          "With --use-rope-scaling: wavelengths above "
          "original-max-position-embeddings / this are divided by the factor "
          "(ours: Megatron fixes it at 1; Hugging Face's low_freq_factor).");
ABSL_FLAG(double, rope_scaling_high_freq_factor, 4.0,
          "With --use-rope-scaling: wavelengths below "
          "original-max-position-embeddings / this are kept (ours: Megatron "
          "fixes it at 4; Hugging Face's high_freq_factor).");
ABSL_FLAG(int64_t, rope_scaling_original_max_position_embeddings, 8192,
          "With --use-rope-scaling: the context the model was first trained "
          "at (ours: Megatron fixes it at 8192; Hugging Face's "
          "original_max_position_embeddings).");
ABSL_FLAG(std::string, normalization, "LayerNorm", "LayerNorm or RMSNorm.");
ABSL_FLAG(double, norm_epsilon, 1e-5, "Normalization epsilon.");
ABSL_FLAG(bool, swiglu, false, "SwiGLU MLP instead of GELU.");
ABSL_FLAG(bool, untie_embeddings_and_output_weights, false,
          "Separate output layer weights.");
ABSL_FLAG(bool, disable_bias_linear, false, "No biases in linear layers.");
ABSL_FLAG(bool, qk_layernorm, false,
          "Normalise Q and K over each head (with --normalization, weights "
          "of head size shared by the heads) before the rotation (Qwen3).");
ABSL_FLAG(bool, add_qkv_bias, false,
          "Keep the QKV projection's bias under --disable-bias-linear "
          "(Qwen2).");
ABSL_FLAG(std::string, window_size, "",
          "Sliding-window attention \"L,0\": each query sees itself and the L "
          "keys before it (Mistral's sliding_window is L + 1); the right "
          "window must be 0. Empty: none.");
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
          "Split norm and dropout regions along the sequence over TP; MoE "
          "layers then route each TP rank's own tokens (expert parallelism "
          "beside TP needs it).");
ABSL_FLAG(int32_t, expert_model_parallel_size, 1,
          "Expert-parallel size (EP): the MoE layers' experts split evenly "
          "over this many ranks of the data-parallel dimension, tokens "
          "moving to them and back (Megatron-Core's rank layout; attention "
          "keeps its TP, CP and DP). Needs MoE layers; beside TP > 1, "
          "--sequence-parallel.");
ABSL_FLAG(int32_t, expert_tensor_parallel_size, 0,
          "Tensor-parallel size inside each expert (ETP: fc1 split by "
          "output, fc2 by input); 0: --tensor-model-parallel-size's, as "
          "Megatron. Needs MoE layers.");
ABSL_FLAG(double, moe_expert_capacity_factor, 0,
          "Capacity per expert = ceil(tokens x topk / experts x this) of "
          "each rank's tokens; routed slots past it are dropped (they add "
          "nothing to their token's output). 0 or negative: dropless.");
ABSL_FLAG(bool, moe_pack_expert_weights, false,
          "CPU: pack each MoE expert's weight once per step for the grouped "
          "GEMM and reuse it in every micro-batch (faster at few rows per "
          "expert with several micro-batches; one more copy of the expert "
          "weights, two for bf16).");
ABSL_FLAG(std::string, moe_token_drop_policy, "probs",
          "Which slots an expert over capacity keeps: probs (the largest "
          "routing weights) or position (the first tokens).");

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
ABSL_FLAG(bool, reset_position_ids, false,
          "Positions restart after each end-of-document token (the learned "
          "position embedding's; rotary positions stay the sequence's, which "
          "changes no attention score within a document).");
ABSL_FLAG(bool, reset_attention_mask, false,
          "Documents packed into a sequence attend only to themselves "
          "(documents end at end-of-document tokens).");
ABSL_FLAG(int32_t, micro_batch_size, 8, "Micro-batch size per DP rank.");
