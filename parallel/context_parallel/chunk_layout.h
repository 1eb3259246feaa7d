#ifndef PARALLEL_CONTEXT_PARALLEL_CHUNK_LAYOUT_H_
#define PARALLEL_CONTEXT_PARALLEL_CHUNK_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"

namespace mcc {
namespace context_parallel {

// Which part of the sequence a context-parallel rank holds.
//
// A sequence of S tokens is cut into 2C chunks of S / (2C); rank i of C
// holds chunks i and 2C - 1 - i, in that order, as one local sequence of
// S / C tokens. Under causal attention an early chunk sees few keys and a
// late chunk many, so pairing them gives every rank the same work (Megatron's
// load balancing). Local positions keep their global order (chunk i comes
// before chunk 2C - 1 - i), so a causal mask over local indices is the
// global one restricted to this rank's own keys.
//
// A value type; thread-safe for concurrent reads.
class ChunkLayout {
 public:
  // Fails, naming the numbers, when C < 1, rank is not in [0, C) or the
  // sequence does not split into 2C equal chunks.
  static absl::StatusOr<ChunkLayout> Create(int context_size, int context_rank,
                                            int64_t seq_length);

  int context_size() const { return size_; }
  int context_rank() const { return rank_; }
  int64_t seq_length() const { return seq_; }
  // Tokens per chunk (S / 2C) and per rank (S / C).
  int64_t chunk_length() const { return seq_ / (2 * size_); }
  int64_t local_length() const { return seq_ / size_; }

  // The global index (0 .. 2C-1) of local chunk 0 or 1 of `rank`.
  static int GlobalChunk(int context_size, int rank, int local_chunk) {
    return local_chunk == 0 ? rank : 2 * context_size - 1 - rank;
  }
  int GlobalChunk(int local_chunk) const {
    return GlobalChunk(size_, rank_, local_chunk);
  }
  // The global position of local index t (0 <= t < S / C).
  int64_t GlobalPosition(int64_t t) const;

  // This rank's columns of a [b, S] tensor (tokens, labels, loss mask;
  // any dtype, any device): [b, S / C], chunk i then chunk 2C - 1 - i.
  // Copies through ops::CopyStrided on the tensor's device.
  absl::StatusOr<Tensor> SliceSequence(const Tensor& full) const;

  std::string ToString() const;  // "CP rank 1 of 2: chunks 1, 2 of 16 tokens"

 private:
  int size_ = 1;
  int rank_ = 0;
  int64_t seq_ = 0;
};

}  // namespace context_parallel
}  // namespace mcc

#endif  // PARALLEL_CONTEXT_PARALLEL_CHUNK_LAYOUT_H_
