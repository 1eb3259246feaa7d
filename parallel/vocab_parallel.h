#ifndef PARALLEL_VOCAB_PARALLEL_H_
#define PARALLEL_VOCAB_PARALLEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/parameter.h"
#include "core/tensor.h"
#include "parallel/linear.h"

namespace mcc {
namespace parallel {

// Marks the rows from vocab_size on of a vocabulary-sized weight (global
// [padded vocab, ...], split along dimension 0 over TP or whole) as padding
// (Parameter::unpadded_rows) and zeroes this rank's share of them. The
// initial values of the other rows do not depend on the padding: the
// generator numbers the full tensor's elements row-major.
absl::Status MarkVocabPadding(Parameter* weight, int64_t vocab_size);

// Word embedding with the vocabulary split across tensor-parallel ranks
// (Megatron's VocabParallelEmbedding): each rank looks up the ids in its
// range, zero rows elsewhere, and the partial rows are summed over TP. The
// weight holds padded_vocab_size rows (divisible by TP); those from
// vocab_size on are padding, zero and never looked up.
class VocabParallelEmbedding {
 public:
  static absl::StatusOr<std::unique_ptr<VocabParallelEmbedding>> Create(
      const std::string& name, int64_t vocab_size, int64_t padded_vocab_size,
      int64_t hidden, const InitSpec& init, const LayerContext& context);

  // ids: int32/int64 [tokens]; returns [tokens, hidden] on every TP rank.
  absl::StatusOr<Tensor> Forward(const Tensor& ids) const;
  // dout: [tokens, hidden], the same on every TP rank.
  absl::Status Backward(const Tensor& ids, const Tensor& dout) const;

  const std::shared_ptr<Parameter>& weight() const { return weight_; }
  int64_t vocab_start() const { return vocab_start_; }
  int64_t local_vocab() const { return local_vocab_; }

 private:
  LayerContext context_;
  int64_t vocab_start_ = 0;
  int64_t local_vocab_ = 0;
  std::shared_ptr<Parameter> weight_;
};

// Cross entropy over logits whose vocabulary is split across TP ranks,
// without ever gathering the full logits: the row maximum, the target logit
// and the sum of exponentials are each reduced over TP. Columns from
// vocab_size on pad the vocabulary: they are left out of the softmax (as if
// their logits were -inf), so the loss does not depend on the padding and
// their gradient is zero.
class VocabParallelCrossEntropy {
 public:
  struct Activations {
    Tensor logits;   // [tokens, local vocab], as given to Forward
    Tensor row_max;  // fp32 [tokens], over the whole vocabulary
    Tensor sums;     // fp32 [2, tokens]: ShardedCrossEntropySums, reduced
    Tensor targets;
    int64_t vocab_start = 0;  // Vocabulary id of this shard's column 0.
    int64_t valid = 0;        // Columns of this shard that are not padding.
    int64_t ignore_index = -100;
  };

  // logits [tokens, padded vocab / TP] (fp32 or bf16) for vocabulary rows
  // [vocab_start, vocab_start + local); vocab_size: the true vocabulary;
  // targets int32/int64 [tokens] in [0, vocab_size), where ignore_index
  // gives loss 0. Returns fp32 [tokens] per-token losses.
  static absl::StatusOr<Tensor> Forward(comm::ProcessGroup* tp,
                                        const Tensor& logits,
                                        const Tensor& targets,
                                        int64_t vocab_start, int64_t vocab_size,
                                        Activations* act,
                                        int64_t ignore_index = -100);
  // dloss fp32 [tokens] -> dlogits [tokens, local vocab] in `dtype`, for
  // the shard, padding and ignore_index that Forward recorded in act.
  static absl::StatusOr<Tensor> Backward(const Tensor& dloss,
                                         const Activations& act, DType dtype);
};

}  // namespace parallel
}  // namespace mcc

#endif  // PARALLEL_VOCAB_PARALLEL_H_
