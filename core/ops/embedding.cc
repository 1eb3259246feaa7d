#include "core/ops/embedding.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {

KernelSlot<EmbeddingKernel>& EmbeddingLookupKernels() {
  static auto* slot = new KernelSlot<EmbeddingKernel>("EmbeddingLookup");
  return *slot;
}
KernelSlot<EmbeddingKernel>& EmbeddingBackwardKernels() {
  static auto* slot = new KernelSlot<EmbeddingKernel>("EmbeddingBackward");
  return *slot;
}

namespace {

template <typename F>
void DispatchIds(DType dtype, F&& fn) {
  if (dtype == DType::kInt32) {
    fn(int32_t{});
  } else {
    fn(int64_t{});
  }
}

// Position [i, j, ...] of flat index i in shape.
std::string Position(const Shape& shape, int64_t flat) {
  Shape pos(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    pos[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return ShapeToString(pos);
}

// Checks every id (CPU): in range, or outside and masked.
absl::Status CheckIds(const char* op, const Tensor& ids, int64_t vocab,
                      const EmbeddingShard& shard) {
  absl::Status status;
  DispatchIds(ids.dtype(), [&](auto tag) {
    using I = decltype(tag);
    const I* p = ids.data<I>();
    for (int64_t i = 0; i < ids.numel(); ++i) {
      const int64_t local = static_cast<int64_t>(p[i]) - shard.vocab_start;
      if ((local < 0 || local >= vocab) && !shard.mask_outside) {
        status = absl::OutOfRangeError(absl::StrCat(
            op, ": id ", static_cast<int64_t>(p[i]), " at position ",
            Position(ids.shape(), i), " of ids ", Brief(ids),
            " is outside the vocabulary [", shard.vocab_start, ", ",
            shard.vocab_start + vocab, ") of size ", vocab));
        return;
      }
    }
  });
  return status;
}

absl::Status Validate(const char* op, const Tensor& ids, const Tensor& table,
                      const char* table_name, const Tensor* out,
                      const char* out_name) {
  MCC_RETURN_IF_ERROR(
      CheckDefined(op, {{"ids", &ids}, {table_name, &table}, {out_name, out}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(
      op, {{"ids", &ids}, {table_name, &table}, {out_name, out}}));
  if (ids.dtype() != DType::kInt32 && ids.dtype() != DType::kInt64) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ids ", Brief(ids), " must be int32 or int64"));
  }
  if (table.dim() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", table_name, " ", Brief(table), " must be [vocab, hidden]"));
  }
  Shape want = ids.shape();
  want.push_back(table.size(1));
  if (out->shape() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ids ", Brief(ids), " and ", table_name, " ", Brief(table), ": ",
        out_name, " ", Brief(*out), " should be ", ShapeToString(want)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingLookup(const Tensor& ids, const Tensor& table,
                             Tensor* out, const EmbeddingShard& shard) {
  const char* op = "EmbeddingLookup";
  MCC_RETURN_IF_ERROR(Validate(op, ids, table, "table", out, "out"));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"table", &table}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"out", out}));
  if (!ids.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(EmbeddingKernel k,
                         EmbeddingLookupKernels().Get(ids.device()));
    return k(ids, table, out, shard);
  }
  const int64_t vocab = table.size(0), hidden = table.size(1);
  MCC_RETURN_IF_ERROR(CheckIds(op, ids, vocab, shard));
  DispatchIds(ids.dtype(), [&](auto it) {
    DispatchFloat(table.dtype(), [&](auto tt) {
      DispatchFloat(out->dtype(), [&](auto ot) {
        using I = decltype(it);
        using TT = decltype(tt);
        using TO = decltype(ot);
        const I* idp = ids.data<I>();
        const TT* tp = table.data<TT>();
        TO* outp = out->data<TO>();
        ParallelForRows(ids.numel(), hidden, [&](int64_t r0, int64_t r1) {
          for (int64_t r = r0; r < r1; ++r) {
            const int64_t local =
                static_cast<int64_t>(idp[r]) - shard.vocab_start;
            TO* dst = outp + r * hidden;
            if (local < 0 || local >= vocab) {
              std::fill(dst, dst + hidden, TO{});
              continue;
            }
            const TT* src = tp + local * hidden;
            if constexpr (std::is_same<TT, TO>::value) {
              std::memcpy(dst, src, hidden * sizeof(TT));
            } else {
              float buf[kBlock];
              for (int64_t j = 0; j < hidden; j += kBlock) {
                const int64_t n = std::min(kBlock, hidden - j);
                const float* f = AsF32(src + j, n, buf);
                StoreF32(f, dst + j, n);
              }
            }
          }
        });
      });
    });
  });
  return absl::OkStatus();
}

absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout,
                               Tensor* dtable, const EmbeddingShard& shard) {
  const char* op = "EmbeddingBackward";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"dtable", dtable}}));
  MCC_RETURN_IF_ERROR(Validate(op, ids, *dtable, "dtable", &dout, "dout"));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"dout", &dout}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"dtable", dtable}, DType::kFloat32));
  if (!ids.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(EmbeddingKernel k,
                         EmbeddingBackwardKernels().Get(ids.device()));
    return k(ids, dout, dtable, shard);
  }
  const int64_t vocab = dtable->size(0), hidden = dtable->size(1);
  MCC_RETURN_IF_ERROR(CheckIds(op, ids, vocab, shard));
  // Threads own disjoint column ranges and walk the tokens in order: no two
  // threads touch one element, and each sum runs in token order.
  const int64_t tokens = ids.numel();
  constexpr int64_t kCols = 256;  // Column tile.
  const int64_t tiles = (hidden + kCols - 1) / kCols;
  float* dt = dtable->data<float>();
  DispatchIds(ids.dtype(), [&](auto it) {
    DispatchFloat(dout.dtype(), [&](auto gt) {
      using I = decltype(it);
      using TG = decltype(gt);
      const I* idp = ids.data<I>();
      const TG* gp = dout.data<TG>();
      ThreadPool::Global().ParallelFor(
          tiles, std::max<int64_t>(1, kGrain / (kCols * tokens + 1)),
          [&](int64_t t0, int64_t t1) {
            const int64_t c0 = t0 * kCols, c1 = std::min(hidden, t1 * kCols);
            float buf[kBlock];
            for (int64_t r = 0; r < tokens; ++r) {
              const int64_t local =
                  static_cast<int64_t>(idp[r]) - shard.vocab_start;
              if (local < 0 || local >= vocab) continue;
              float* dst = dt + local * hidden;
              for (int64_t c = c0; c < c1; c += kBlock) {
                const int64_t n = std::min(kBlock, c1 - c);
                const float* g = AsF32(gp + r * hidden + c, n, buf);
                for (int64_t j = 0; j < n; ++j) dst[c + j] += g[j];
              }
            }
          });
    });
  });
  return absl::OkStatus();
}

}  // namespace ops
}  // namespace mcc
