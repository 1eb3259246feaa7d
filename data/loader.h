#ifndef DATA_LOADER_H_
#define DATA_LOADER_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/tensor.h"
#include "data/sample_dataset.h"

namespace mcc::data {

struct LoaderConfig {
  int64_t micro_batch_size = 1;
  int dp_rank = 0;
  int dp_size = 1;
  // False on pipeline stages that take no data (neither the first stage,
  // which needs tokens, nor the last, which needs labels): Next() then reads
  // nothing and returns empty tensors, but still advances the count.
  bool needs_data = true;
  // Global samples already consumed (all DP ranks together): the resume
  // point, as Megatron's --consumed-train-samples.
  int64_t consumed_samples = 0;
  int prefetch = 4;  // micro-batches prepared ahead by the background thread
  // Megatron's masking options; eod < 0 disables both.
  int64_t eod = -1;
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  // Packed documents attend only to themselves (Megatron's
  // --reset-attention-mask): MicroBatch::document_start is filled.
  bool reset_attention_mask = false;
};

// One micro-batch: tokens and labels int64 [micro_batch, seq], loss_mask
// fp32 [micro_batch, seq], position_ids int64 [micro_batch, seq].
struct MicroBatch {
  Tensor tokens, labels, loss_mask, position_ids;
  // With reset_attention_mask: int32 [micro_batch, seq], where each token's
  // document starts (a document begins after each eod token, as Megatron's
  // get_ltor_masks_and_position_ids); undefined otherwise.
  Tensor document_start;
  // Global samples consumed once this micro-batch (and its peers on the
  // other DP ranks) is done: the value to save in a checkpoint.
  int64_t consumed_samples = 0;
};

// Megatron's pretraining sampler: the global micro-batch starting at
// `consumed` holds samples [consumed, consumed + mbs * dp_size); DP rank r
// takes [consumed + r * mbs, consumed + (r + 1) * mbs). Tensor-parallel ranks
// of one DP rank get the same samples.
int64_t FirstSampleOfMicroBatch(int64_t consumed, int64_t micro_batch_size,
                                int dp_rank);

// Fills a micro-batch from samples [first, first + mbs) of dataset.
MicroBatch MakeMicroBatch(const SampleDataset& dataset, int64_t first,
                          const LoaderConfig& config);

// Micro-batches for one DP rank, prepared by a background thread into a
// bounded queue, resumable at any consumed-samples count.
class DataLoader {
 public:
  static absl::StatusOr<std::unique_ptr<DataLoader>> Create(
      std::shared_ptr<const SampleDataset> dataset, const LoaderConfig& config);
  ~DataLoader();

  // The next micro-batch; OutOfRange when the dataset holds no further full
  // global micro-batch.
  absl::StatusOr<MicroBatch> Next();
  int64_t consumed_samples() const { return consumed_; }
  const LoaderConfig& config() const { return config_; }
  // Micro-batches left (global, all DP ranks at once).
  int64_t remaining() const;

 private:
  DataLoader() = default;
  void Produce();

  std::shared_ptr<const SampleDataset> dataset_;
  LoaderConfig config_;
  int64_t consumed_ = 0;  // as seen by the consumer
  int64_t stride_ = 0;    // mbs * dp_size

  absl::Mutex mu_;
  std::deque<MicroBatch> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace mcc::data

#endif  // DATA_LOADER_H_
