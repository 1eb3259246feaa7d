#ifndef CORE_CHECKED_MATH_H_
#define CORE_CHECKED_MATH_H_

#include <cstdint>
#include <optional>

#include "absl/types/span.h"

namespace mcc {

// Sizes read from files or peers are multiplied here, never with a bare `*`:
// an overflow wraps to a small number that then passes the size checks.

// a * b, or nullopt when it does not fit in int64 (or a or b is negative).
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &out)) {
    return std::nullopt;
  }
  return out;
}

// a + b, or nullopt when it does not fit in int64 (or a or b is negative).
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t out;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &out)) {
    return std::nullopt;
  }
  return out;
}

// The product of the extents times element_size: the bytes of a tensor of
// that shape; nullopt on a negative extent or when the count overflows int64.
inline std::optional<int64_t> CheckedNumBytes(absl::Span<const int64_t> shape,
                                              int64_t element_size) {
  std::optional<int64_t> n = element_size;
  for (int64_t d : shape) {
    if (!n.has_value()) break;
    n = CheckedMul(*n, d);
  }
  return n;
}

}  // namespace mcc

#endif  // CORE_CHECKED_MATH_H_
