#ifndef CORE_OPS_EMBEDDING_H_
#define CORE_OPS_EMBEDDING_H_

// Embedding lookup of token ids in a [vocab, hidden] table, and its
// backward, which scatter-adds into the fp32 table gradient.

#include <cstdint>

#include "absl/status/status.h"
#include "core/ops/dispatch.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {

// For a vocab-parallel shard (Megatron's VocabParallelEmbedding): the table
// holds rows [vocab_start, vocab_start + vocab) of the full vocabulary; ids
// outside that range give zero rows (and no gradient) when mask_outside is
// set, and are errors otherwise.
struct EmbeddingShard {
  int64_t vocab_start = 0;
  bool mask_outside = false;
};

// out [..., hidden] = table[ids[...]]; ids int32 or int64 of any shape; table
// and out fp32 or bf16. An id out of range is an error naming the id, its
// position and the vocabulary size, and nothing is written.
absl::Status EmbeddingLookup(const Tensor& ids, const Tensor& table,
                             Tensor* out, const EmbeddingShard& shard = {});

// dtable[ids[...]] += dout[...]: dtable fp32 [vocab, hidden], dout fp32 or
// bf16 [..., hidden]. Deterministic (each table row is summed in token
// order whatever the thread count).
absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout,
                               Tensor* dtable,
                               const EmbeddingShard& shard = {});

// Kernels (core/ops/dispatch.h), with the ops' signatures: out overwritten,
// dtable accumulated; the device's current stream. Ids are data, so the
// kernel checks their range: the CPU kernel returns the error before
// writing anything; a device kernel that cannot report it without
// synchronising with the host states what it does instead.
using EmbeddingKernel = absl::Status (*)(const Tensor& ids, const Tensor& table,
                                         Tensor* out,
                                         const EmbeddingShard& shard);
KernelSlot<EmbeddingKernel>& EmbeddingLookupKernels();
KernelSlot<EmbeddingKernel>& EmbeddingBackwardKernels();

}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_EMBEDDING_H_
