#ifndef DATA_SAMPLE_DATASET_H_
#define DATA_SAMPLE_DATASET_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"

namespace mcc::data {

// Token id that fills the tail of a sample shorter than sequence_length + 1
// (only the last validation sample, when partial samples are kept). The
// loader turns it into token 0 with loss mask 0, as Megatron does.
inline constexpr int64_t kPadTokenId = -1;

// A dataset of fixed-length token samples (sequence_length + 1 tokens: the
// inputs and, shifted by one, the labels).
class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t sequence_length() const = 0;
  // Writes sample idx's sequence_length() + 1 tokens to out.
  virtual void GetSample(int64_t idx, int64_t* out) const = 0;
  // Whether samples carry a loss mask of their own (fine-tuning data, whose
  // loss covers only the assistant's tokens).
  virtual bool has_loss_mask() const { return false; }
  // Writes the sequence_length() + 1 mask values (1: train on this token;
  // 0: not; padding is 0) aligned with GetSample's tokens. Only when
  // has_loss_mask().
  virtual void GetLossMask(int64_t idx, int64_t* out) const {}
};

// The companion of an indexed dataset at `prefix` that holds its tokens'
// loss mask: an indexed dataset of uint8 0/1 with the same sequence lengths,
// at "<prefix>_loss_mask" (preprocess_data --sft writes both).
inline std::string LossMaskPrefix(const std::string& prefix) {
  return prefix + "_loss_mask";
}

// How the ranks of a job share an index build: rank() says which rank this
// is and barrier() waits for all of them, returning an error (a peer that
// died, a timeout) instead of hanging or aborting. Either may be empty (one
// process: rank 0, no barrier). Taken as callbacks so //data needs no
// communication library.
struct RankSync {
  std::function<int()> rank;
  std::function<absl::Status()> barrier;

  int Rank() const { return rank ? rank() : 0; }
  absl::Status Barrier() const {
    return barrier ? barrier() : absl::OkStatus();
  }
};

}  // namespace mcc::data

#endif  // DATA_SAMPLE_DATASET_H_
