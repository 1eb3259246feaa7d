#ifndef DATA_BLENDED_DATASET_H_
#define DATA_BLENDED_DATASET_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "data/gpt_dataset.h"
#include "data/sample_dataset.h"

namespace mcc::data {

// Megatron's blending: sample i goes to the dataset whose weight * max(i, 1)
// most exceeds the samples it has had so far (ties to the lowest index).
// Fills dataset_index (which dataset) and dataset_sample_index (its n-th
// sample) for `size` samples.
void BuildBlendingIndices(absl::Span<const double> weights, int64_t size,
                          std::vector<int16_t>* dataset_index,
                          std::vector<int64_t>* dataset_sample_index);

// Weights divided by their sum.
std::vector<double> NormalizeWeights(absl::Span<const double> weights);

// A --data-path value: "prefix", "prefixA prefixB" (blend by size) or
// "0.3 prefixA 0.7 prefixB" (blend by weight). weights is empty when none
// were given.
struct Blend {
  std::vector<std::string> prefixes;
  std::vector<double> weights;
};
absl::StatusOr<Blend> ParseDataPath(absl::Span<const std::string> words);
// The same from one string split on whitespace.
absl::StatusOr<Blend> ParseDataPath(absl::string_view text);

// --split "949,50,1" as [begin, end) fractions per split (train, valid,
// test); a split of zero width is nullopt.
using SplitMatrix = std::array<std::optional<std::pair<double, double>>, 3>;
absl::StatusOr<SplitMatrix> ParseSplit(absl::string_view text);
// The sequence range [begin, end) of n sequences a split covers (Python's
// round-half-even, as Megatron's int(round(f * n))).
std::pair<int64_t, int64_t> SplitRange(std::pair<double, double> fractions,
                                       int64_t n);

// Samples drawn from several datasets in Megatron's blended order.
class BlendedDataset : public SampleDataset {
 public:
  static absl::StatusOr<std::unique_ptr<BlendedDataset>> Create(
      std::vector<std::shared_ptr<const SampleDataset>> datasets,
      std::vector<double> weights, int64_t size);

  int64_t size() const override { return dataset_index_.size(); }
  int64_t sequence_length() const override {
    return datasets_[0]->sequence_length();
  }
  void GetSample(int64_t idx, int64_t* out) const override;
  // Masks when every part has them (Create refuses a mix).
  bool has_loss_mask() const override { return datasets_[0]->has_loss_mask(); }
  void GetLossMask(int64_t idx, int64_t* out) const override;

  const std::vector<int16_t>& dataset_index() const { return dataset_index_; }
  const std::vector<int64_t>& dataset_sample_index() const {
    return dataset_sample_index_;
  }

 private:
  BlendedDataset() = default;
  std::vector<std::shared_ptr<const SampleDataset>> datasets_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

// Builds the train, valid and test datasets of a blend as Megatron's
// BlendedMegatronDatasetBuilder does: each prefix is split by `split`; with
// weights, prefix k's split i draws ceil(ceil(size_i * w_k) * 1.005) samples
// and the blend has sum_k ceil(size_i * w_k); without weights one epoch of
// each, blended by length. sizes[i] unset means one epoch. Entries for empty
// splits are null. Collective over the ranks in sync, like GPTDataset::Build.
absl::StatusOr<std::array<std::shared_ptr<const SampleDataset>, 3>>
BuildGPTDatasets(const Blend& blend, absl::string_view split,
                 const std::array<std::optional<int64_t>, 3>& sizes,
                 const GPTDatasetConfig& config, const RankSync& sync = {});

}  // namespace mcc::data

#endif  // DATA_BLENDED_DATASET_H_
