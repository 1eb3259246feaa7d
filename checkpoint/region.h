#ifndef CHECKPOINT_REGION_H_
#define CHECKPOINT_REGION_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace mcc {

// An axis-aligned box of a global N-d tensor: elements
// [offsets[d], offsets[d] + shape[d]) in every dimension d. A block of data
// that holds a box is stored row-major and contiguous.
struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> shape;

  int64_t NumElements() const;
  bool Empty() const;            // Some extent is zero.
  std::string ToString() const;  // "[0:4, 8:16]"
};

// The intersection of two boxes of the same rank (possibly empty).
Box Intersect(const Box& a, const Box& b);

// Whether inner lies entirely within outer.
bool Contains(const Box& outer, const Box& inner);

// Calls fn(src_index, dst_index, count) for every maximal run of contiguous
// elements in the intersection of src and dst, where the indices are element
// positions in the row-major blocks holding src and dst. Dimensions over
// which both blocks and the intersection are full are fused, so a box that
// splits a tensor along dimension 0 yields a single run.
void ForEachOverlapRun(
    const Box& src, const Box& dst,
    const std::function<void(int64_t src_index, int64_t dst_index,
                             int64_t count)>& fn);

// Copies the elements of src's block that fall inside dst's box into dst's
// block (same element size); returns how many elements were copied.
int64_t CopyOverlap(const void* src_data, const Box& src, void* dst_data,
                    const Box& dst, size_t element_size);

}  // namespace mcc

#endif  // CHECKPOINT_REGION_H_
