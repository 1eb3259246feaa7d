#include "core/ops/layout.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

std::string PlanString(const StridedCopyPlan& p) {
  return absl::StrCat(
      "shape ",
      ShapeToString(absl::Span<const int64_t>(p.shape, std::max(p.rank, 0))),
      " src strides [",
      absl::StrJoin(
          absl::Span<const int64_t>(p.src_strides, std::max(p.rank, 0)), ", "),
      "] + ", p.src_offset, ", dst strides [",
      absl::StrJoin(
          absl::Span<const int64_t>(p.dst_strides, std::max(p.rank, 0)), ", "),
      "] + ", p.dst_offset);
}

// The last element a side of the plan addresses (the plan is not empty).
int64_t LastIndex(const StridedCopyPlan& p, const int64_t* strides,
                  int64_t offset) {
  int64_t last = offset;
  for (int k = 0; k < p.rank; ++k) last += (p.shape[k] - 1) * strides[k];
  return last;
}

// Whether no two indices of the plan address one destination element.
bool DstIsInjective(const StridedCopyPlan& p) {
  int order[kMaxCopyDims];
  int n = 0;
  for (int k = 0; k < p.rank; ++k) {
    if (p.shape[k] > 1) order[n++] = k;
  }
  // Insertion sort by destination stride (at most kMaxCopyDims entries;
  // std::sort here trips GCC 12's -Warray-bounds on a branch it never takes).
  for (int i = 1; i < n; ++i) {
    for (int j = i;
         j > 0 && p.dst_strides[order[j]] < p.dst_strides[order[j - 1]]; --j) {
      std::swap(order[j], order[j - 1]);
    }
  }
  int64_t span = 1;  // Elements covered by the dimensions so far.
  for (int i = 0; i < n; ++i) {
    const int k = order[i];
    if (p.dst_strides[k] < span) return false;
    span = p.dst_strides[k] * (p.shape[k] - 1) + span;
  }
  return true;
}

absl::Status ValidateCopy(const char* op, const Tensor& src,
                          const StridedCopyPlan& p, const Tensor* dst,
                          bool* empty) {
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"src", &src}, {"dst", dst}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"src", &src}, {"dst", dst}}));
  if (src.dtype() != dst->dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": src ", Brief(src), " and dst ", Brief(*dst),
                     " differ in dtype (Convert converts)"));
  }
  if (p.rank < 0 || p.rank > kMaxCopyDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": rank ", p.rank, " is outside [0, ", kMaxCopyDims, "]"));
  }
  bool is_empty = false;
  for (int k = 0; k < p.rank; ++k) {
    if (p.shape[k] < 0 || p.src_strides[k] < 0 || p.dst_strides[k] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": negative size or stride in ", PlanString(p)));
    }
    is_empty |= p.shape[k] == 0;
  }
  if (p.src_offset < 0 || p.dst_offset < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": negative offset in ", PlanString(p)));
  }
  *empty = is_empty;
  if (is_empty) return absl::OkStatus();
  const int64_t src_last = LastIndex(p, p.src_strides, p.src_offset);
  const int64_t dst_last = LastIndex(p, p.dst_strides, p.dst_offset);
  if (src_last >= src.numel() || dst_last >= dst->numel()) {
    return absl::OutOfRangeError(
        absl::StrCat(op, ": ", PlanString(p), " reaches element ",
                     src_last >= src.numel() ? src_last : dst_last, " of ",
                     src_last >= src.numel() ? "src " : "dst ",
                     Brief(src_last >= src.numel() ? src : *dst)));
  }
  if (!DstIsInjective(p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", PlanString(p), " writes some dst elements twice"));
  }
  if (src.SharesStorageWith(*dst)) {
    const size_t es = DTypeSize(src.dtype());
    const auto s0 =
        reinterpret_cast<uintptr_t>(src.raw_data()) + p.src_offset * es;
    const auto s1 =
        reinterpret_cast<uintptr_t>(src.raw_data()) + (src_last + 1) * es;
    const auto d0 =
        reinterpret_cast<uintptr_t>(dst->raw_data()) + p.dst_offset * es;
    const auto d1 =
        reinterpret_cast<uintptr_t>(dst->raw_data()) + (dst_last + 1) * es;
    if (s0 < d1 && d0 < s1) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": the regions of src ", Brief(src), " and dst ",
                       Brief(*dst), " overlap"));
    }
  }
  return absl::OkStatus();
}

// The plan with size-1 dimensions dropped and nested dimensions that are
// contiguous in both tensors merged, so the innermost loop is as long as
// it can be.
StridedCopyPlan Simplify(const StridedCopyPlan& p) {
  StridedCopyPlan q;
  q.src_offset = p.src_offset;
  q.dst_offset = p.dst_offset;
  for (int k = 0; k < p.rank; ++k) {
    if (p.shape[k] == 1) continue;
    if (q.rank > 0) {
      const int j = q.rank - 1;
      if (q.src_strides[j] == p.shape[k] * p.src_strides[k] &&
          q.dst_strides[j] == p.shape[k] * p.dst_strides[k]) {
        q.shape[j] *= p.shape[k];
        q.src_strides[j] = p.src_strides[k];
        q.dst_strides[j] = p.dst_strides[k];
        continue;
      }
    }
    q.shape[q.rank] = p.shape[k];
    q.src_strides[q.rank] = p.src_strides[k];
    q.dst_strides[q.rank] = p.dst_strides[k];
    ++q.rank;
  }
  return q;
}

template <typename T>
void CopyInner(const T* s, int64_t ss, T* d, int64_t ds, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
}

// Copies one run of the innermost dimension.
inline void CopyInnerRun(const char* s, char* d, size_t es, int64_t n,
                         int64_t ss, int64_t ds) {
  if (ss == 1 && ds == 1) {
    std::memcpy(d, s, n * es);
  } else if (es == 4) {
    CopyInner(reinterpret_cast<const uint32_t*>(s), ss,
              reinterpret_cast<uint32_t*>(d), ds, n);
  } else if (es == 2) {
    CopyInner(reinterpret_cast<const uint16_t*>(s), ss,
              reinterpret_cast<uint16_t*>(d), ds, n);
  } else {
    CopyInner(reinterpret_cast<const uint64_t*>(s), ss,
              reinterpret_cast<uint64_t*>(d), ds, n);
  }
}

absl::Status StridedCopyCpu(const Tensor& src, const StridedCopyPlan& plan,
                            Tensor* dst) {
  const StridedCopyPlan p = Simplify(plan);
  const size_t es = DTypeSize(src.dtype());
  const char* sp = static_cast<const char*>(src.raw_data()) + p.src_offset * es;
  char* dp = static_cast<char*>(dst->raw_data()) + p.dst_offset * es;
  if (p.rank == 0) {
    std::memcpy(dp, sp, es);
    return absl::OkStatus();
  }
  const int inner = p.rank - 1;
  const int64_t n = p.shape[inner];
  const int64_t ss = p.src_strides[inner], ds = p.dst_strides[inner];
  int64_t outer = 1;
  for (int k = 0; k < inner; ++k) outer *= p.shape[k];
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(n, 1));
  ThreadPool::Global().ParallelFor(outer, grain, [&](int64_t o0, int64_t o1) {
    // The outer index of run o0 by division once, then counted up digit by
    // digit (an odometer) with the two offsets kept alongside.
    int64_t idx[kMaxCopyDims] = {};
    int64_t so = 0, dof = 0;
    for (int64_t k = inner - 1, rest = o0; k >= 0; --k) {
      idx[k] = rest % p.shape[k];
      rest /= p.shape[k];
      so += idx[k] * p.src_strides[k];
      dof += idx[k] * p.dst_strides[k];
    }
    for (int64_t o = o0; o < o1; ++o) {
      CopyInnerRun(sp + so * es, dp + dof * es, es, n, ss, ds);
      for (int k = inner - 1; k >= 0; --k) {
        so += p.src_strides[k];
        dof += p.dst_strides[k];
        if (++idx[k] < p.shape[k]) break;
        so -= p.shape[k] * p.src_strides[k];
        dof -= p.shape[k] * p.dst_strides[k];
        idx[k] = 0;
      }
    }
  });
  return absl::OkStatus();
}

// The plan copying all of `part` (contiguous) into or out of `whole` at
// position `at` along dim.
StridedCopyPlan PiecePlan(const Tensor& whole, const Tensor& part, int dim,
                          int64_t at, bool into_whole) {
  StridedCopyPlan p;
  p.rank = part.dim();
  int64_t whole_strides[kMaxCopyDims], part_strides[kMaxCopyDims];
  ContiguousStrides(whole.shape(), whole_strides);
  ContiguousStrides(part.shape(), part_strides);
  for (int k = 0; k < p.rank; ++k) {
    p.shape[k] = part.shape()[k];
    (into_whole ? p.dst_strides : p.src_strides)[k] = whole_strides[k];
    (into_whole ? p.src_strides : p.dst_strides)[k] = part_strides[k];
  }
  (into_whole ? p.dst_offset : p.src_offset) = at * whole_strides[dim];
  return p;
}

absl::Status CheckPieces(const char* op, const Tensor& whole,
                         absl::Span<const Tensor* const> parts, int dim) {
  if (whole.dim() > kMaxCopyDims) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", Brief(whole), " has more than ", kMaxCopyDims,
                     " dimensions"));
  }
  if (dim < 0 || dim >= whole.dim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": dimension ", dim, " out of range for ", Brief(whole)));
  }
  int64_t total = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Tensor* t = parts[i];
    const std::string name = absl::StrCat("piece ", i);
    MCC_RETURN_IF_ERROR(CheckDefined(op, {{name.c_str(), t}}));
    MCC_RETURN_IF_ERROR(
        CheckSameDevice(op, {{"whole", &whole}, {name.c_str(), t}}));
    bool same = t->dim() == whole.dim() && t->dtype() == whole.dtype();
    for (int k = 0; same && k < whole.dim(); ++k) {
      same = k == dim || t->shape()[k] == whole.shape()[k];
    }
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", name, " ", Brief(*t), " must have the dtype ",
          "and, but for dimension ", dim, ", the shape of ", Brief(whole)));
    }
    total += t->shape()[dim];
  }
  if (total != whole.shape()[dim]) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": pieces add up to ", total, " along dimension ", dim,
                     ", not ", whole.shape()[dim], " of ", Brief(whole)));
  }
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(StridedCopyKernel, StridedCopyKernels, "StridedCopy",
                &StridedCopyCpu);

void ContiguousStrides(absl::Span<const int64_t> shape, int64_t* strides) {
  int64_t s = 1;
  for (int k = static_cast<int>(shape.size()) - 1; k >= 0; --k) {
    strides[k] = s;
    s *= shape[k];
  }
}

StridedCopyPlan SwapSides(const StridedCopyPlan& plan) {
  StridedCopyPlan p = plan;
  std::swap(p.src_offset, p.dst_offset);
  for (int k = 0; k < kMaxCopyDims; ++k) {
    std::swap(p.src_strides[k], p.dst_strides[k]);
  }
  return p;
}

absl::Status CopyStrided(const Tensor& src, const StridedCopyPlan& plan,
                         Tensor* dst) {
  ScopedOpTimer op_timer("CopyStrided");
  bool empty = false;
  MCC_RETURN_IF_ERROR(ValidateCopy("CopyStrided", src, plan, dst, &empty));
  if (empty) return absl::OkStatus();
  return StridedCopyKernels()(src.device(), src, plan, dst);
}

absl::Status Permute(const Tensor& x, absl::Span<const int> perm, Tensor* y) {
  ScopedOpTimer op_timer("Permute");
  const char* op = "Permute";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}, {"y", y}}));
  const int rank = x.dim();
  if (rank > kMaxCopyDims || static_cast<int>(perm.size()) != rank) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": permutation [", absl::StrJoin(perm, ", "), "] of ",
                     Brief(x), " (at most ", kMaxCopyDims, " dimensions)"));
  }
  bool seen[kMaxCopyDims] = {};
  Shape want(rank);
  for (int k = 0; k < rank; ++k) {
    if (perm[k] < 0 || perm[k] >= rank || seen[perm[k]]) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": [", absl::StrJoin(perm, ", "), "] is not a permutation of ",
          "the dimensions of ", Brief(x)));
    }
    seen[perm[k]] = true;
    want[k] = x.shape()[perm[k]];
  }
  if (y->shape() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": y ", Brief(*y), " must be ", ShapeToString(want), " for ",
        Brief(x), " permuted by [", absl::StrJoin(perm, ", "), "]"));
  }
  StridedCopyPlan p;
  p.rank = rank;
  int64_t xs[kMaxCopyDims];
  ContiguousStrides(x.shape(), xs);
  ContiguousStrides(y->shape(), p.dst_strides);
  for (int k = 0; k < rank; ++k) {
    p.shape[k] = want[k];
    p.src_strides[k] = xs[perm[k]];
  }
  bool empty = false;
  MCC_RETURN_IF_ERROR(ValidateCopy(op, x, p, y, &empty));
  if (empty) return absl::OkStatus();
  return StridedCopyKernels()(x.device(), x, p, y);
}

absl::Status Concat(absl::Span<const Tensor> xs, int dim, Tensor* y) {
  ScopedOpTimer op_timer("Concat");
  const char* op = "Concat";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"y", y}}));
  std::vector<const Tensor*> parts;
  parts.reserve(xs.size());
  for (const Tensor& x : xs) parts.push_back(&x);
  MCC_RETURN_IF_ERROR(CheckPieces(op, *y, parts, dim));
  for (const Tensor& x : xs) {
    if (x.SharesStorageWith(*y)) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": input ", Brief(x), " shares storage with y ", Brief(*y)));
    }
  }
  int64_t at = 0;
  for (const Tensor& x : xs) {
    if (x.numel() > 0) {
      MCC_RETURN_IF_ERROR(StridedCopyKernels()(
          x.device(), x, PiecePlan(*y, x, dim, at, /*into_whole=*/true), y));
    }
    at += x.shape()[dim];
  }
  return absl::OkStatus();
}

absl::Status Split(const Tensor& x, int dim, absl::Span<Tensor* const> outs) {
  ScopedOpTimer op_timer("Split");
  const char* op = "Split";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}}));
  MCC_RETURN_IF_ERROR(CheckPieces(
      op, x, absl::Span<const Tensor* const>(outs.data(), outs.size()), dim));
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i]->SharesStorageWith(x)) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": output ", i, " ", Brief(*outs[i]),
                       " shares storage with x ", Brief(x)));
    }
  }
  int64_t at = 0;
  for (Tensor* out : outs) {
    if (out->numel() > 0) {
      MCC_RETURN_IF_ERROR(StridedCopyKernels()(
          x.device(), x, PiecePlan(x, *out, dim, at, /*into_whole=*/false),
          out));
    }
    at += out->shape()[dim];
  }
  return absl::OkStatus();
}

}  // namespace ops
}  // namespace mcc
