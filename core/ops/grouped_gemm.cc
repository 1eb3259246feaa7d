#include "core/ops/grouped_gemm.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/expert_weight_packing.h"
#include "core/ops/gemm.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

absl::Status Fail(const char* op, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

// Every size non-negative, summing to rows.
absl::Status CheckGroupSizes(const char* op, absl::Span<const int64_t> sizes,
                             int64_t groups, int64_t rows) {
  if (static_cast<int64_t>(sizes.size()) != groups) {
    return Fail(op, absl::StrCat(sizes.size(), " group sizes for ", groups,
                                 " weight matrices"));
  }
  int64_t total = 0;
  for (size_t g = 0; g < sizes.size(); ++g) {
    if (sizes[g] < 0) {
      return Fail(op, absl::StrCat("group ", g, " has ", sizes[g], " rows"));
    }
    total += sizes[g];
  }
  if (total != rows) {
    return Fail(op, absl::StrCat("group sizes sum to ", total, ", not the ",
                                 rows, " rows of x"));
  }
  return absl::OkStatus();
}

// The [rows, cols] matrix of group g of a [G, rows, cols] tensor.
absl::StatusOr<Tensor> GroupMatrix(const Tensor& w, int64_t g) {
  MCC_ASSIGN_OR_RETURN(Tensor s, w.Slice(g, g + 1));
  return s.Reshape({w.size(1), w.size(2)});
}

// Runs fn(t) for t in [0, threads) on the pool's threads, each with its
// GEMMs on that thread alone (oneDNN's OpenMP team of one): small GEMMs cost
// less than the fork and join of a team around each of them
// (grouped_gemm_bench: 64 experts of 64 rows).
absl::Status OnEachThread(int threads,
                          const std::function<absl::Status(int)>& fn) {
  std::vector<absl::Status> status(threads);
  ThreadPool::Global().ParallelFor(threads, 1, [&](int64_t t0, int64_t t1) {
    internal::ScopedSingleThreadedGemm single;
    internal::ScopedBf16ShapeClass shape_class;
    // The calling op's timer counts this time; a null op marks the worker
    // as inside it, so the GEMMs are not counted again.
    ScopedOpTimer inside_the_op(nullptr);
    for (int64_t t = t0; t < t1; ++t) status[t] = fn(static_cast<int>(t));
  });
  for (const absl::Status& st : status) MCC_RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

// Below this many rows a group's GEMM does too little work per byte of its
// weight (or fp32 gradient) for oneDNN's packing and tile loads to hide
// reading it from memory: 64 experts of 64 rows (h512, f256, one thread)
// ran the forward at 63% of a dense GEMM's rate and the fp32 weight
// gradient at 67%, against ~86% with each expert's matrices already cached.
constexpr int64_t kWarmMaxRows = 256;
// Only matrices that fit in a core's L2 cache (with the GEMM's packed
// panels beside them) are warmed.
constexpr int64_t kWarmMaxBytes = 512 << 10;

// Reads one byte of every cache line of t's (contiguous, host) data, front
// to back, so a small-row GEMM finds the matrix in cache: a plain sequential
// stream runs at the memory's bandwidth, where the GEMM's own strided reads
// stall on each miss (one thread, fp32 weight gradient of 64 x 64 rows:
// 8.3 ms -> 6.5-6.8 ms, the stream alone ~0.9 ms; docs/benchmarks/
// 2026-12-05.md). Only reads: no result changes.
void WarmCache(const Tensor& t) {
  const unsigned char* p = static_cast<const unsigned char*>(t.raw_data());
  unsigned char sum = 0;
  for (size_t i = 0; i < t.nbytes(); i += 64) sum ^= p[i];
  thread_local volatile unsigned char sink;  // Keeps the loads.
  sink = sum;
}

bool ShouldWarm(int64_t rows, const Tensor& t) {
  return rows <= kWarmMaxRows &&
         t.nbytes() <= static_cast<size_t>(kWarmMaxBytes);
}

// y rows [r0, r1) (across groups): one GEMM per group piece, through the
// expert's packed weight where `packs` (the caller's
// ScopedExpertWeightPacking) takes it.
absl::Status GroupedGemmRows(const Tensor& x, const Tensor& w, bool trans_w,
                             absl::Span<const int64_t> sizes, Tensor* y,
                             float beta, int64_t r0, int64_t r1,
                             internal::ExpertWeightPacks* packs) {
  int64_t first = 0;
  for (size_t g = 0; g < sizes.size() && first < r1; ++g) {
    const int64_t lo = std::max(r0, first), hi = std::min(r1, first + sizes[g]);
    first += sizes[g];
    if (lo >= hi) continue;
    MCC_ASSIGN_OR_RETURN(Tensor xg, x.Slice(lo, hi));
    MCC_ASSIGN_OR_RETURN(Tensor yg, y->Slice(lo, hi));
    if (packs != nullptr) {
      MCC_ASSIGN_OR_RETURN(
          const bool done,
          internal::PackedExpertGemm(packs, w, trans_w, g, xg, &yg, beta));
      if (done) continue;
    }
    MCC_ASSIGN_OR_RETURN(Tensor wg, GroupMatrix(w, g));
    if (ShouldWarm(hi - lo, wg)) WarmCache(wg);
    MCC_RETURN_IF_ERROR(Gemm(xg, false, wg, trans_w, &yg, 1.0f, beta));
  }
  return absl::OkStatus();
}

absl::Status GroupedGemmCpu(const Tensor& x, const Tensor& w, bool trans_w,
                            absl::Span<const int64_t> sizes, Tensor* y,
                            float beta) {
  // Expert row counts change every step: one bf16 path measurement per
  // power-of-two shape class, not per count.
  internal::ScopedBf16ShapeClass shape_class;
  // The scope lives on the calling thread; the pool's workers get it here.
  internal::ExpertWeightPacks* packs = internal::CurrentExpertWeightPacks();
  const int threads = ThreadPool::Global().num_threads();
  const int64_t rows = x.size(0);
  if (threads < 2 || rows < 2 * threads) {
    return GroupedGemmRows(x, w, trans_w, sizes, y, beta, 0, rows, packs);
  }
  // Output rows are independent: thread t takes rows [t R / T, (t + 1) R /
  // T) whatever the groups, so skewed groups share evenly. Which GEMMs run
  // depends only on the sizes and the thread count: a call repeats its bits.
  return OnEachThread(threads, [&](int t) {
    return GroupedGemmRows(x, w, trans_w, sizes, y, beta, rows * t / threads,
                           rows * (t + 1) / threads, packs);
  });
}

// dw_g for groups [g0, g1), their rows starting at `row`.
absl::Status GroupedWeightGradGroups(const Tensor& x, const Tensor& dy,
                                     bool trans_w,
                                     absl::Span<const int64_t> sizes,
                                     Tensor* dw, float beta, int64_t g0,
                                     int64_t g1, int64_t row) {
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t m = sizes[g];
    MCC_ASSIGN_OR_RETURN(Tensor dwg, GroupMatrix(*dw, g));
    if (m == 0) {
      // An empty product is zero: dw_g = beta * dw_g.
      float* p = dwg.data<float>();
      if (beta == 0.0f) {
        std::memset(p, 0, dwg.nbytes());
      } else if (beta != 1.0f) {
        for (int64_t i = 0; i < dwg.numel(); ++i) p[i] *= beta;
      }
      continue;
    }
    MCC_ASSIGN_OR_RETURN(Tensor xg, x.Slice(row, row + m));
    MCC_ASSIGN_OR_RETURN(Tensor dyg, dy.Slice(row, row + m));
    // The fp32 GEMM reads the accumulated gradient tile by tile; oneDNN's
    // bf16 GEMM ran slower with it warmed (4.0 -> 4.4-4.9 ms in the probe).
    if (beta != 0.0f && x.dtype() == DType::kFloat32 && ShouldWarm(m, dwg)) {
      WarmCache(dwg);
    }
    if (trans_w) {
      MCC_RETURN_IF_ERROR(Gemm(dyg, true, xg, false, &dwg, 1.0f, beta));
    } else {
      MCC_RETURN_IF_ERROR(Gemm(xg, true, dyg, false, &dwg, 1.0f, beta));
    }
    row += m;
  }
  return absl::OkStatus();
}

absl::Status GroupedGemmWeightGradCpu(const Tensor& x, const Tensor& dy,
                                      bool trans_w,
                                      absl::Span<const int64_t> sizes,
                                      Tensor* dw, float beta) {
  internal::ScopedBf16ShapeClass shape_class;  // As in GroupedGemmCpu.
  const int threads = ThreadPool::Global().num_threads();
  const int64_t groups = static_cast<int64_t>(sizes.size());
  // A group's rows are its GEMM's reduction: the groups, not the rows, are
  // shared out, side by side once there are enough of them to balance
  // (twice the threads), in contiguous runs of about equal rows.
  if (threads < 2 || groups < 2 * threads) {
    return GroupedWeightGradGroups(x, dy, trans_w, sizes, dw, beta, 0, groups,
                                   0);
  }
  std::vector<int64_t> first(groups + 1, 0);
  for (int64_t g = 0; g < groups; ++g) first[g + 1] = first[g] + sizes[g];
  std::vector<int64_t> bounds(threads + 1, groups);
  bounds[0] = 0;
  for (int t = 1; t < threads; ++t) {
    // The group boundary nearest to t R / T.
    const int64_t cut = first[groups] * t / threads;
    int64_t g = bounds[t - 1];
    while (g < groups && first[g + 1] <= cut) ++g;
    if (g < groups && cut - first[g] > first[g + 1] - cut) ++g;
    bounds[t] = g;
  }
  return OnEachThread(threads, [&](int t) {
    return GroupedWeightGradGroups(x, dy, trans_w, sizes, dw, beta, bounds[t],
                                   bounds[t + 1], first[bounds[t]]);
  });
}

// x [M, K] and w [G, K, N] / [G, N, K] of one dtype; returns N.
absl::StatusOr<int64_t> CheckOperands(const char* op, const Tensor& x,
                                      const Tensor& w, bool trans_w) {
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"w", &w}));
  if (x.dtype() != w.dtype()) {
    return Fail(op, absl::StrCat("x ", Brief(x), " and w ", Brief(w),
                                 " must have one dtype"));
  }
  if (x.dim() != 2 || w.dim() != 3) {
    return Fail(
        op, absl::StrCat("x ", Brief(x), " must be [rows, K] and w ", Brief(w),
                         " [groups, ", trans_w ? "N, K]" : "K, N]"));
  }
  const int64_t k = trans_w ? w.size(2) : w.size(1);
  if (k != x.size(1)) {
    return Fail(op, absl::StrCat("x ", Brief(x), " and w ", Brief(w),
                                 trans_w ? " (transposed)" : "",
                                 " differ in the inner dimension"));
  }
  return trans_w ? w.size(1) : w.size(2);
}

}  // namespace

absl::Status GroupedGemm(const Tensor& x, const Tensor& w, bool trans_w,
                         absl::Span<const int64_t> group_sizes, Tensor* y,
                         float beta) {
  ScopedOpTimer op_timer("GroupedGemm");
  const char* op = "GroupedGemm";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}, {"w", &w}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", &x}, {"w", &w}, {"y", y}}));
  MCC_ASSIGN_OR_RETURN(const int64_t n, CheckOperands(op, x, w, trans_w));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"y", y}));
  if (y->dtype() != DType::kFloat32 && y->dtype() != x.dtype()) {
    return Fail(op,
                absl::StrCat("y ", Brief(*y), " must be fp32 or x's dtype"));
  }
  if (y->shape() != Shape{x.size(0), n}) {
    return Fail(op, absl::StrCat("y ", Brief(*y), " must be [", x.size(0), ", ",
                                 n, "]"));
  }
  MCC_RETURN_IF_ERROR(CheckGroupSizes(op, group_sizes, w.size(0), x.size(0)));
  return GroupedGemmKernels()(x.device(), x, w, trans_w, group_sizes, y, beta);
}

absl::Status GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy,
                                   bool trans_w,
                                   absl::Span<const int64_t> group_sizes,
                                   Tensor* dw, float beta) {
  ScopedOpTimer op_timer("GroupedGemmWeightGrad");
  const char* op = "GroupedGemmWeightGrad";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}, {"dy", &dy}, {"dw", dw}}));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"x", &x}, {"dy", &dy}, {"dw", dw}}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"dw", dw}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"dy", &dy}));
  if (x.dtype() != dy.dtype()) {
    return Fail(op, absl::StrCat("x ", Brief(x), " and dy ", Brief(dy),
                                 " must have one dtype"));
  }
  if (x.dim() != 2 || dy.dim() != 2 || dy.size(0) != x.size(0) ||
      dw->dim() != 3) {
    return Fail(op, absl::StrCat("x ", Brief(x), " and dy ", Brief(dy),
                                 " must be [rows, .] with the same rows, dw ",
                                 Brief(*dw), " [groups, ., .]"));
  }
  const Shape want = trans_w ? Shape{dw->size(0), dy.size(1), x.size(1)}
                             : Shape{dw->size(0), x.size(1), dy.size(1)};
  if (dw->shape() != want) {
    return Fail(
        op, absl::StrCat("dw ", Brief(*dw), " must be ", ShapeToString(want),
                         " for x ", Brief(x), " and dy ", Brief(dy)));
  }
  MCC_RETURN_IF_ERROR(CheckGroupSizes(op, group_sizes, dw->size(0), x.size(0)));
  return GroupedGemmWeightGradKernels()(x.device(), x, dy, trans_w, group_sizes,
                                        dw, beta);
}

MCC_KERNEL_SLOT(GroupedGemmKernel, GroupedGemmKernels, "GroupedGemm",
                &GroupedGemmCpu);
MCC_KERNEL_SLOT(GroupedGemmWeightGradKernel, GroupedGemmWeightGradKernels,
                "GroupedGemmWeightGrad", &GroupedGemmWeightGradCpu);

}  // namespace ops
}  // namespace mcc
