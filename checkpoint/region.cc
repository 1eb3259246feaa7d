#include "checkpoint/region.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace mcc {

int64_t Box::NumElements() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

bool Box::Empty() const {
  for (int64_t s : shape) {
    if (s <= 0) return true;
  }
  return false;
}

std::string Box::ToString() const {
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) {
    absl::StrAppend(&out, d ? ", " : "", offsets[d], ":",
                    offsets[d] + shape[d]);
  }
  return out + "]";
}

Box Intersect(const Box& a, const Box& b) {
  CHECK_EQ(a.shape.size(), b.shape.size());
  CHECK_EQ(a.offsets.size(), a.shape.size());
  CHECK_EQ(b.offsets.size(), b.shape.size());
  Box out;
  out.offsets.resize(a.shape.size());
  out.shape.resize(a.shape.size());
  for (size_t d = 0; d < a.shape.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi =
        std::min(a.offsets[d] + a.shape[d], b.offsets[d] + b.shape[d]);
    out.offsets[d] = lo;
    out.shape[d] = std::max<int64_t>(0, hi - lo);
  }
  return out;
}

bool Contains(const Box& outer, const Box& inner) {
  if (outer.shape.size() != inner.shape.size()) return false;
  for (size_t d = 0; d < outer.shape.size(); ++d) {
    if (inner.offsets[d] < outer.offsets[d] ||
        inner.offsets[d] + inner.shape[d] > outer.offsets[d] + outer.shape[d]) {
      return false;
    }
  }
  return true;
}

void ForEachOverlapRun(
    const Box& src, const Box& dst,
    const std::function<void(int64_t, int64_t, int64_t)>& fn) {
  const Box box = Intersect(src, dst);
  if (box.Empty()) return;
  const int nd = static_cast<int>(box.shape.size());
  if (nd == 0) {
    fn(0, 0, 1);
    return;
  }
  // Row-major strides of both blocks.
  std::vector<int64_t> src_stride(nd), dst_stride(nd);
  int64_t s = 1, t = 1;
  for (int d = nd - 1; d >= 0; --d) {
    src_stride[d] = s;
    dst_stride[d] = t;
    s *= src.shape[d];
    t *= dst.shape[d];
  }
  // Fuse trailing dimensions: a dimension joins the run when every dimension
  // after it is full in both blocks and in the intersection.
  int first_run_dim = nd - 1;
  int64_t run = box.shape[nd - 1];
  while (first_run_dim > 0) {
    const int d = first_run_dim;
    if (box.shape[d] != src.shape[d] || box.shape[d] != dst.shape[d]) break;
    --first_run_dim;
    run *= box.shape[first_run_dim];
  }
  // Odometer over the dimensions before first_run_dim.
  std::vector<int64_t> idx(first_run_dim, 0);
  int64_t src_base = 0, dst_base = 0;
  for (int d = 0; d < nd; ++d) {
    src_base += (box.offsets[d] - src.offsets[d]) * src_stride[d];
    dst_base += (box.offsets[d] - dst.offsets[d]) * dst_stride[d];
  }
  while (true) {
    int64_t si = src_base, di = dst_base;
    for (int d = 0; d < first_run_dim; ++d) {
      si += idx[d] * src_stride[d];
      di += idx[d] * dst_stride[d];
    }
    fn(si, di, run);
    int d = first_run_dim - 1;
    while (d >= 0 && ++idx[d] == box.shape[d]) {
      idx[d] = 0;
      --d;
    }
    if (d < 0) break;
  }
}

int64_t CopyOverlap(const void* src_data, const Box& src, void* dst_data,
                    const Box& dst, size_t element_size) {
  const auto* in = static_cast<const char*>(src_data);
  auto* out = static_cast<char*>(dst_data);
  int64_t copied = 0;
  ForEachOverlapRun(src, dst, [&](int64_t si, int64_t di, int64_t n) {
    std::memcpy(out + di * element_size, in + si * element_size,
                n * element_size);
    copied += n;
  });
  return copied;
}

}  // namespace mcc
