#ifndef MODELS_GPT_DOCUMENT_MASK_H_
#define MODELS_GPT_DOCUMENT_MASK_H_

// Which keys each query sees when documents are packed into one sequence
// (Megatron's --reset-attention-mask) and/or attention has a sliding window
// (--window-size L,0; Mistral's sliding_window = L + 1): the first visible
// key of every query, as ops::AttentionOptions::first_key takes it. The
// causal limit (key <= query) is the kernel's.

#include <cstdint>

#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace mcc {
namespace gpt {

// document_start: int32 [b, s] on the host, the position of the first
// token of each token's document (undefined: one document a sequence).
// window_left: keys before the query that it still sees (-1: no window).
// Returns int32 [b, s] on the host, max(document_start, i - window_left),
// or an undefined tensor when neither applies.
absl::StatusOr<Tensor> AttentionFirstKeys(const Tensor& document_start,
                                          int64_t b, int64_t s,
                                          int64_t window_left);

// The document starts of token ids as Megatron's get_ltor_masks_and_
// position_ids finds them: a new document begins after each `eod` token.
// tokens: int64 [b, s] on the host. Returns int32 [b, s].
Tensor DocumentStartsAfterEod(const Tensor& tokens, int64_t eod);

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_DOCUMENT_MASK_H_
