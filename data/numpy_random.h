#ifndef DATA_NUMPY_RANDOM_H_
#define DATA_NUMPY_RANDOM_H_

#include <cstdint>
#include <random>
#include <utility>

namespace mcc::data {

// numpy.random.RandomState(seed) for the calls Megatron's index builders make.
//
// RandomState(int seed) seeds MT19937 with init_genrand(seed) (Matsumoto and
// Nishimura's 32-bit seeding, which std::mt19937(seed) also uses), and
// RandomState.shuffle(x) on a 1-D array runs, for i = n-1 down to 1,
// j = random_interval(i) and swaps x[i] and x[j]. random_interval(max) draws
// masked values until one is <= max, where the mask is the smallest 2^k - 1
// covering max: a 32-bit draw when max fits 32 bits, else a 64-bit draw built
// from two 32-bit outputs (first one high). Checked against numpy 1.24 by
// numpy_random_test (fixture from data/testdata/gen_numpy_fixtures.py).
class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed) : mt_(seed) {}

  uint32_t NextUInt32() { return static_cast<uint32_t>(mt_()); }
  uint64_t NextUInt64() {
    const uint64_t hi = NextUInt32();
    return (hi << 32) | NextUInt32();
  }
  // A uniform integer in [0, max].
  uint64_t RandomInterval(uint64_t max) {
    if (max == 0) return 0;
    uint64_t mask = max;
    mask |= mask >> 1;
    mask |= mask >> 2;
    mask |= mask >> 4;
    mask |= mask >> 8;
    mask |= mask >> 16;
    mask |= mask >> 32;
    uint64_t value;
    if (max <= 0xffffffffULL) {
      while ((value = (NextUInt32() & mask)) > max) {
      }
    } else {
      while ((value = (NextUInt64() & mask)) > max) {
      }
    }
    return value;
  }
  // RandomState.shuffle on a 1-D array of n elements.
  template <typename T>
  void Shuffle(T* data, int64_t n) {
    for (int64_t i = n - 1; i >= 1; --i) {
      const int64_t j = static_cast<int64_t>(RandomInterval(i));
      std::swap(data[i], data[j]);
    }
  }

 private:
  std::mt19937 mt_;
};

}  // namespace mcc::data

#endif  // DATA_NUMPY_RANDOM_H_
