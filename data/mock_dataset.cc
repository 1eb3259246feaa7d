#include "data/mock_dataset.h"

namespace mcc::data {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

void MockDataset::GetSample(int64_t idx, int64_t* out) const {
  const uint64_t h = SplitMix64(seed_ * 1000003u + static_cast<uint64_t>(idx));
  const int64_t start = static_cast<int64_t>(h % vocab_size_);
  const int64_t stride = 1 + static_cast<int64_t>((h >> 32) % 3);
  for (int64_t j = 0; j <= sequence_length_; ++j) {
    out[j] = (start + stride * j) % vocab_size_;
  }
}

}  // namespace mcc::data
