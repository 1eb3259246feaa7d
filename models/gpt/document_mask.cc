#include "models/gpt/document_mask.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace gpt {

absl::StatusOr<Tensor> AttentionFirstKeys(const Tensor& document_start,
                                          int64_t b, int64_t s,
                                          int64_t window_left) {
  if (!document_start.defined() && window_left < 0) return Tensor();
  if (document_start.defined() && (document_start.dtype() != DType::kInt32 ||
                                   !document_start.device().is_cpu() ||
                                   document_start.shape() != Shape{b, s})) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch document_start ", document_start.Describe(),
                     " (--reset-attention-mask) must be int32 [batch, seq] = ",
                     ShapeToString({b, s}), " on the host"));
  }
  Tensor first = Tensor::Empty({b, s}, DType::kInt32);
  int32_t* f = first.data<int32_t>();
  const int32_t* doc =
      document_start.defined() ? document_start.data<int32_t>() : nullptr;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < s; ++i) {
      int64_t key = doc != nullptr ? doc[bi * s + i] : 0;
      if (key < 0 || key > i) {
        return absl::InvalidArgumentError(absl::StrCat(
            "micro-batch document_start: token ", i, " of sequence ", bi,
            " starts its document at ", key, ", not in [0, ", i, "]"));
      }
      if (window_left >= 0) key = std::max(key, i - window_left);
      f[bi * s + i] = static_cast<int32_t>(key);
    }
  }
  return first;
}

Tensor DocumentStartsAfterEod(const Tensor& tokens, int64_t eod) {
  const int64_t b = tokens.size(0), s = tokens.size(1);
  Tensor starts = Tensor::Empty({b, s}, DType::kInt32);
  const int64_t* t = tokens.data<int64_t>();
  int32_t* out = starts.data<int32_t>();
  for (int64_t bi = 0; bi < b; ++bi) {
    int32_t start = 0;
    for (int64_t i = 0; i < s; ++i) {
      out[bi * s + i] = start;
      if (t[bi * s + i] == eod) start = static_cast<int32_t>(i + 1);
    }
  }
  return starts;
}

}  // namespace gpt
}  // namespace mcc
