#ifndef MODELS_GPT_MODEL_FLOPS_H_
#define MODELS_GPT_MODEL_FLOPS_H_

#include <cstdint>

#include "models/gpt/gpt_config.h"

namespace mcc {
namespace gpt {

// Model FLOPs of one training token (forward and backward, 3x forward, no
// recomputation) as Megatron counts them for MFU: the GEMMs of every layer
// (QKV, output projection, MLP in and out), attention scores and weighted
// values over the full sequence, and the output layer. train's MFU and
// tools/plan's step-time model both count with it.
double TrainingFlopsPerToken(const GPTConfig& config);

// The attention part of TrainingFlopsPerToken (scores and weighted values,
// every layer): seq_length keys per query, as Megatron's formula counts a
// causal sequence.
double AttentionTrainingFlopsPerToken(const GPTConfig& config);

// The causal (query, key) pairs attention computes over `b` sequences of `s`
// tokens when query i sees the keys from max(document_start[i],
// i - window_left) to itself (document_start: int32 [b, s] row-major, null
// for one document a sequence; window_left -1: no window), the way
// models/gpt/document_mask.h limits them.
int64_t CausalAttentionPairs(const int32_t* document_start, int64_t b,
                             int64_t s, int64_t window_left);
// Without documents or a window: b x s (s + 1) / 2.
int64_t FullCausalAttentionPairs(int64_t b, int64_t s);

// Training FLOPs of `tokens` tokens whose attention computes `fraction` of
// the full causal pairs (CausalAttentionPairs over FullCausalAttentionPairs
// of their micro-batches): the attention term scaled by it, so packed
// documents (--reset-attention-mask) and a sliding window (--window-size)
// count only the work they need, on the same scale as an unmasked run.
double TrainingFlops(const GPTConfig& config, double tokens,
                     double attention_fraction);

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_MODEL_FLOPS_H_
