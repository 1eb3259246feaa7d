#ifndef DATA_GPT_DATASET_H_
#define DATA_GPT_DATASET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "data/indexed_dataset.h"
#include "data/numpy_random.h"
#include "data/sample_dataset.h"

namespace mcc::data {

enum class Split { kTrain = 0, kValid = 1, kTest = 2 };
const char* SplitName(Split split);  // "train", "valid", "test"

struct GPTDatasetConfig {
  int32_t sequence_length = 1024;
  uint32_t random_seed = 1234;  // Megatron's --seed
  // Keep the last, partial validation sample (padded); Megatron's
  // drop_last_partial_validation_sequence inverted.
  bool drop_last_partial_validation_sequence = true;
  // Where the index cache lives; empty means "<dir of prefix>/cache/
  // GPTDataset_indices" as Megatron's default. "-" disables the cache (every
  // rank builds in memory).
  std::string path_to_cache;
  // Fine-tuning data (--sft): each prefix's loss mask is read from its
  // companion (LossMaskPrefix) and every sample carries it.
  bool loss_mask = false;
};

// ------------------------------------------------------------------
// The index builders, as Megatron-LM's GPTDataset builds them.

// Number of epochs needed to draw num_samples samples of sequence_length
// (+1 extra token) from tokens_per_epoch tokens; 1 when num_samples is unset.
int NumEpochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples,
              int32_t sequence_length);

// The documents (sequence ids), repeated num_epochs times and shuffled; with
// separate_final_epoch the last epoch is shuffled on its own after the others.
std::vector<int32_t> BuildDocumentIndex(absl::Span<const int32_t> documents,
                                        int num_epochs, NumpyRandomState& rng,
                                        bool separate_final_epoch);

// Called now and then by the index builders with (samples done, samples in
// all), on the building thread.
using IndexBuildProgress = std::function<void(int64_t done, int64_t total)>;

// Sample boundaries as (document-index position, token offset) pairs, flat:
// [2 * (num_samples + 1)]. Sample i runs from pair i to pair i + 1 inclusive
// of one extra token, across document boundaries. `progress`, when set, is
// called every kIndexProgressEvery samples and once at the end.
inline constexpr int64_t kIndexProgressEvery = int64_t{1} << 16;
std::vector<int64_t> BuildSampleIndex(
    absl::Span<const int32_t> sizes, absl::Span<const int32_t> document_index,
    int32_t sequence_length, int num_epochs, int64_t tokens_per_epoch,
    bool drop_last_partial_sequence,
    const IndexBuildProgress& progress = nullptr);

// [0, num_samples) shuffled, then [num_samples, total_size) shuffled apart.
std::vector<int64_t> BuildShuffleIndex(int64_t num_samples, int64_t total_size,
                                       NumpyRandomState& rng);

// The three indices of one GPT dataset split.
struct GPTIndices {
  std::vector<int32_t> document_index;
  std::vector<int64_t> sample_index;  // flat pairs
  std::vector<int64_t> shuffle_index;
  int num_epochs = 1;
  bool separate_final_epoch = false;
};

// Builds the indices for the sequences [begin, end) of dataset `sizes`.
// Builds of kIndexProgressFrom samples or more show a progress line (the
// sample index, the long part) when stderr is a terminal; see
// core/progress_meter.h.
inline constexpr int64_t kIndexProgressFrom = int64_t{1} << 22;
GPTIndices BuildGPTIndices(absl::Span<const int32_t> sizes, int64_t begin,
                           int64_t end, std::optional<int64_t> num_samples,
                           Split split, const GPTDatasetConfig& config);

// ------------------------------------------------------------------

// Samples of sequence_length + 1 tokens from the sequences [begin, end) of
// an indexed dataset, in Megatron's shuffled order.
class GPTDataset : public SampleDataset {
 public:
  // Builds (rank 0, on a cache miss) or loads the indices. All ranks must
  // call it together: rank 0 builds and writes the cache, everyone waits at
  // sync.Barrier(), then the other ranks load the files rank 0 wrote.
  static absl::StatusOr<std::unique_ptr<GPTDataset>> Build(
      std::shared_ptr<const IndexedDataset> dataset, int64_t begin, int64_t end,
      std::optional<int64_t> num_samples, Split split,
      const GPTDatasetConfig& config, const RankSync& sync = {});

  int64_t size() const override { return shuffle_index_.size(); }
  int64_t sequence_length() const override { return config_.sequence_length; }
  void GetSample(int64_t idx, int64_t* out) const override;
  bool has_loss_mask() const override { return loss_mask_ != nullptr; }
  void GetLossMask(int64_t idx, int64_t* out) const override;

  // Reads each sample's loss mask from `mask` (LossMaskPrefix), which must
  // have the dataset's sequence lengths; the error names both files.
  absl::Status AttachLossMask(std::shared_ptr<const IndexedDataset> mask);

  const GPTIndices& indices() const { return indices_; }
  // Description text the cache file names hash, and the hash.
  const std::string& description() const { return description_; }
  const std::string& description_hash() const { return hash_; }
  bool built_anew() const { return built_anew_; }
  const std::string& cache_prefix() const { return cache_prefix_; }

 private:
  GPTDataset() = default;
  // Sample idx of `from` (the tokens or their mask), padded with `pad`.
  void ReadSample(const IndexedDataset& from, int64_t idx, int64_t pad,
                  int64_t* out) const;
  std::shared_ptr<const IndexedDataset> dataset_;
  std::shared_ptr<const IndexedDataset> loss_mask_;
  GPTDatasetConfig config_;
  GPTIndices indices_;
  std::vector<int64_t>& shuffle_index_ = indices_.shuffle_index;
  std::string description_, hash_, cache_prefix_;
  bool built_anew_ = false;
};

// 64-bit FNV-1a of text, as 16 hex digits.
std::string HashHex(const std::string& text);

}  // namespace mcc::data

#endif  // DATA_GPT_DATASET_H_
