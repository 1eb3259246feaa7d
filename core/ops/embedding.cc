#include "core/ops/embedding.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {

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

// One table row's bytes: plain 32-byte moves (glibc's memcpy picks
// `rep movsb` for rows of a few KiB, slower here on scattered rows).
inline void CopyRow(const void* src, void* dst, int64_t bytes) {
  int64_t b = 0;
#if defined(__AVX2__)
  const char* s = static_cast<const char*>(src);
  char* d = static_cast<char*>(dst);
  for (; b + 128 <= bytes; b += 128) {
    const __m256i v0 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + b));
    const __m256i v1 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + b + 32));
    const __m256i v2 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + b + 64));
    const __m256i v3 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + b + 96));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + b), v0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + b + 32), v1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + b + 64), v2);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + b + 96), v3);
  }
#endif
  std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b,
              bytes - b);
}

// dst[c0, c1) += the dout rows of `count` tokens (order[k].second), one
// after another in token order; 32 columns at a time stay in registers.
template <typename TG>
void ScatterAddRow(const TG* dout, int64_t hidden,
                   const std::pair<int64_t, int64_t>* order, int64_t count,
                   int64_t c0, int64_t c1, float* dst) {
  int64_t c = c0;
#if defined(__AVX2__)
  for (; c + 32 <= c1; c += 32) {
    __m256 a0 = _mm256_loadu_ps(dst + c), a1 = _mm256_loadu_ps(dst + c + 8);
    __m256 a2 = _mm256_loadu_ps(dst + c + 16);
    __m256 a3 = _mm256_loadu_ps(dst + c + 24);
    for (int64_t k = 0; k < count; ++k) {
      const TG* g = dout + order[k].second * hidden + c;
      a0 = _mm256_add_ps(a0, Load8(g));
      a1 = _mm256_add_ps(a1, Load8(g + 8));
      a2 = _mm256_add_ps(a2, Load8(g + 16));
      a3 = _mm256_add_ps(a3, Load8(g + 24));
    }
    _mm256_storeu_ps(dst + c, a0);
    _mm256_storeu_ps(dst + c + 8, a1);
    _mm256_storeu_ps(dst + c + 16, a2);
    _mm256_storeu_ps(dst + c + 24, a3);
  }
#endif
  for (; c < c1; ++c) {
    float a = dst[c];
    for (int64_t k = 0; k < count; ++k) {
      a += ToF32(dout[order[k].second * hidden + c]);
    }
    dst[c] = a;
  }
}

}  // namespace

absl::Status EmbeddingLookup(const Tensor& ids, const Tensor& table,
                             Tensor* out, const EmbeddingShard& shard) {
  ScopedOpTimer op_timer("EmbeddingLookup");
  const char* op = "EmbeddingLookup";
  MCC_RETURN_IF_ERROR(Validate(op, ids, table, "table", out, "out"));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"table", &table}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"out", out}));
  return EmbeddingLookupKernels()(ids.device(), ids, table, out, shard);
}

namespace {

absl::Status EmbeddingLookupCpu(const Tensor& ids, const Tensor& table,
                                Tensor* out, const EmbeddingShard& shard) {
  const int64_t vocab = table.size(0), hidden = table.size(1);
  MCC_RETURN_IF_ERROR(CheckIds("EmbeddingLookup", ids, vocab, shard));
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
            // Rows are scattered across the table: start fetching the next
            // token's row while this one copies (the hardware prefetcher
            // restarts at each row).
            if (r + 1 < r1) {
              const int64_t next =
                  static_cast<int64_t>(idp[r + 1]) - shard.vocab_start;
              if (next >= 0 && next < vocab) {
                const char* np =
                    reinterpret_cast<const char*>(tp + next * hidden);
                const int64_t row_bytes = hidden * sizeof(TT);
                for (int64_t b = 0; b < row_bytes; b += 64) {
                  __builtin_prefetch(np + b);
                }
              }
            }
            TO* dst = outp + r * hidden;
            if (local < 0 || local >= vocab) {
              std::fill(dst, dst + hidden, TO{});
              continue;
            }
            const TT* src = tp + local * hidden;
            if constexpr (std::is_same<TT, TO>::value) {
              CopyRow(src, dst, hidden * sizeof(TT));
            } else {
#if defined(__AVX2__)
              ConvertInRegisters(src, dst, hidden);
#else
              float buf[kBlock];
              for (int64_t j = 0; j < hidden; j += kBlock) {
                const int64_t n = std::min(kBlock, hidden - j);
                const float* f = AsF32(src + j, n, buf);
                StoreF32(f, dst + j, n);
              }
#endif
            }
          }
        });
      });
    });
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout,
                               Tensor* dtable, const EmbeddingShard& shard) {
  ScopedOpTimer op_timer("EmbeddingBackward");
  const char* op = "EmbeddingBackward";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"dtable", dtable}}));
  MCC_RETURN_IF_ERROR(Validate(op, ids, *dtable, "dtable", &dout, "dout"));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"dout", &dout}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"dtable", dtable}, DType::kFloat32));
  return EmbeddingBackwardKernels()(ids.device(), ids, dout, dtable, shard);
}

namespace {

absl::Status EmbeddingBackwardCpu(const Tensor& ids, const Tensor& dout,
                                  Tensor* dtable, const EmbeddingShard& shard) {
  const int64_t vocab = dtable->size(0), hidden = dtable->size(1);
  MCC_RETURN_IF_ERROR(CheckIds("EmbeddingBackward", ids, vocab, shard));
  // Tokens are grouped by row (a stable sort keeps token order within a row)
  // and threads own disjoint rows: each dtable row is read and written once,
  // every dout row read once, and each element's sum still runs in token
  // order, so the result is bit-identical to a serial scatter-add for any
  // thread count. A row with many tokens is split into column tiles.
  const int64_t tokens = ids.numel();
  float* dt = dtable->data<float>();
  DispatchIds(ids.dtype(), [&](auto it) {
    using I = decltype(it);
    const I* idp = ids.data<I>();
    std::vector<std::pair<int64_t, int64_t>> order;  // (row, token)
    order.reserve(tokens);
    for (int64_t r = 0; r < tokens; ++r) {
      const int64_t local = static_cast<int64_t>(idp[r]) - shard.vocab_start;
      if (local >= 0 && local < vocab) order.emplace_back(local, r);
    }
    std::sort(order.begin(), order.end());  // (row, token): token order kept.
    // Work items: [begin, end) of `order` (one row), columns [c0, c1).
    struct Item {
      int64_t begin, end, c0, c1;
    };
    std::vector<Item> items;
    constexpr int64_t kMinTile = 256;
    for (size_t b = 0; b < order.size();) {
      size_t e = b + 1;
      while (e < order.size() && order[e].first == order[b].first) ++e;
      const int64_t len = static_cast<int64_t>(e - b);
      int64_t tiles =
          std::min<int64_t>((len * hidden) / (4 * kGrain) + 1,
                            std::max<int64_t>(1, hidden / kMinTile));
      const int64_t step = (hidden + tiles - 1) / tiles;
      for (int64_t c = 0; c < hidden; c += step) {
        items.push_back({static_cast<int64_t>(b), static_cast<int64_t>(e), c,
                         std::min(hidden, c + step)});
      }
      b = e;
    }
    DispatchFloat(dout.dtype(), [&](auto gt) {
      using TG = decltype(gt);
      const TG* gp = dout.data<TG>();
      ThreadPool::Global().ParallelFor(
          static_cast<int64_t>(items.size()),
          std::max<int64_t>(1, kGrain / std::max<int64_t>(1, hidden)),
          [&](int64_t i0, int64_t i1) {
            for (int64_t w = i0; w < i1; ++w) {
              const Item& item = items[w];
              float* dst = dt + order[item.begin].first * hidden;
              ScatterAddRow(gp, hidden, order.data() + item.begin,
                            item.end - item.begin, item.c0, item.c1, dst);
            }
          });
    });
  });
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(EmbeddingKernel, EmbeddingLookupKernels, "EmbeddingLookup",
                &EmbeddingLookupCpu);
MCC_KERNEL_SLOT(EmbeddingKernel, EmbeddingBackwardKernels, "EmbeddingBackward",
                &EmbeddingBackwardCpu);

}  // namespace ops
}  // namespace mcc
