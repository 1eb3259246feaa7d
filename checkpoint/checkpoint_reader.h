#ifndef CHECKPOINT_CHECKPOINT_READER_H_
#define CHECKPOINT_CHECKPOINT_READER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/checkpoint.pb.h"
#include "checkpoint/config.pb.h"
#include "checkpoint/sharded_tensor.h"
#include "core/tensor.h"

namespace mcc {

// Reads one complete checkpoint, under any layout: every read names a box of
// a global tensor and is assembled from whichever stored shards overlap it,
// each verified against its CRC32C. One thread at a time may read.
class CheckpointReader {
 public:
  // Opens DIR/iter_N for iteration N, or the iteration that
  // DIR/latest_checkpointed_iteration.txt names when none is given.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& dir, std::optional<int64_t> iteration = std::nullopt);
  ~CheckpointReader();

  int64_t iteration() const { return metadata_.iteration(); }
  const std::string& path() const { return path_; }  // DIR/iter_N
  const checkpoint::CheckpointMetadata& metadata() const { return metadata_; }
  const checkpoint::CommonState& common_state() const {
    return metadata_.common();
  }
  // The RNG states rank `rank` saved; NotFound when the checkpoint had
  // fewer ranks.
  absl::StatusOr<checkpoint::RankState> RankStateOf(int rank) const;

  std::vector<std::string> TensorNames() const;
  // NotFound, naming the tensor, when it was not saved.
  absl::StatusOr<const checkpoint::TensorRecord*> FindTensor(
      absl::string_view name) const;

  // Fills *out (any dtype: values are converted; any device) with the box of
  // tensor `name` that starts at global_offsets and has out's shape.
  absl::Status ReadRegion(absl::string_view name,
                          absl::Span<const int64_t> global_offsets,
                          Tensor* out);
  // The whole tensor in its stored dtype.
  absl::StatusOr<Tensor> ReadTensor(absl::string_view name);
  // For each ref: checks that the stored global shape equals
  // ref.global_shape, then reads the ref's box into ref.local.
  absl::Status Load(const std::vector<ShardedTensorRef>& refs);

  // An error listing every field that differs between the stored model
  // configuration and `run` (e.g. "hidden_size: checkpoint 1024, run 2048").
  // padded_vocab_size is not compared: the padding belongs to the layout of
  // the run that wrote the checkpoint, not to the model. Nor is seq_length
  // (the run's sequences, bounded by max_position_embeddings), nor, when
  // both use rotary positions, max_position_embeddings (no table depends on
  // it): a Hugging Face import of a long-context model fine-tunes at any
  // sequence length.
  absl::Status CheckModelConfig(const checkpoint::ModelConfig& run) const;

  // The bytes of every shard file the metadata names (each opened once):
  // all the checkpoint can hold, to bound what a stored configuration asks
  // a reader to allocate before any tensor is read. An error names a file
  // that is missing.
  absl::StatusOr<int64_t> ShardFileBytes();

 private:
  CheckpointReader() = default;
  absl::Status Validate() const;
  absl::StatusOr<int> FileFor(const std::string& file,
                              absl::string_view tensor);
  // The size of shard file `file` (opened by FileFor), read when opened.
  absl::StatusOr<int64_t> FileSize(const std::string& file,
                                   absl::string_view tensor);
  // DataLoss ("truncated") when the shard's bytes are not all in its file.
  absl::Status CheckShardInFile(const checkpoint::TensorRecord& t,
                                const checkpoint::ShardRecord& s);
  absl::Status ReadShard(const checkpoint::TensorRecord& t,
                         const checkpoint::ShardRecord& s, std::string* buf);

  std::string path_;
  checkpoint::CheckpointMetadata metadata_;
  std::map<std::string, int, std::less<>> index_;  // Name to tensors() index.
  std::mutex mu_;
  std::map<std::string, int> fds_;
  std::map<std::string, int64_t> file_sizes_;  // Of the files in fds_.
  // The last shard read and verified (file:offset) and its bytes.
  std::string cache_key_;
  std::string cache_;
};

// The rows a checkpoint's vocabulary tensors (word embedding, untied output
// layer) hold: vocab_size; checkpoints written before the TP padding left
// the model hold padded_vocab_size rows, the last ones padding.
int64_t StoredVocabRows(const checkpoint::ModelConfig& config);

}  // namespace mcc

#endif  // CHECKPOINT_CHECKPOINT_READER_H_
