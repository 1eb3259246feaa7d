#ifndef DATA_MOCK_DATASET_H_
#define DATA_MOCK_DATASET_H_

#include <cstdint>

#include "data/sample_dataset.h"

namespace mcc::data {

// Synthetic samples for --mock-data (as Megatron's MockGPTDataset): no
// files. Sample i counts upward from a start drawn from (seed, i) with a
// stride drawn likewise, modulo the vocabulary, so a model can learn it and
// its loss visibly falls.
class MockDataset : public SampleDataset {
 public:
  MockDataset(int64_t size, int64_t sequence_length, int64_t vocab_size,
              uint64_t seed)
      : size_(size),
        sequence_length_(sequence_length),
        vocab_size_(vocab_size),
        seed_(seed) {}

  int64_t size() const override { return size_; }
  int64_t sequence_length() const override { return sequence_length_; }
  void GetSample(int64_t idx, int64_t* out) const override;

 private:
  int64_t size_, sequence_length_, vocab_size_;
  uint64_t seed_;
};

}  // namespace mcc::data

#endif  // DATA_MOCK_DATASET_H_
