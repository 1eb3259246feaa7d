#include "core/ops/gemm.h"

#include <immintrin.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"
#include "dnnl.h"
#include "dnnl.hpp"
#include "glog/logging.h"

namespace mcc {
namespace ops {
namespace {

// oneDNN (Debian's build) runs on OpenMP, whose thread count is per calling
// thread: set it to the pool's size before each call, unless a batched loop
// that already runs on the pool's threads asked for one thread per GEMM.
thread_local int t_omp_threads = -1;
thread_local int t_omp_override = 0;
// Whether bf16 path choices key each dimension rounded up to a power of two
// (internal::ScopedBf16ShapeClass).
thread_local bool t_bf16_shape_class = false;

int64_t RoundUpToPowerOfTwo(int64_t v) {
  int64_t c = 1;
  while (c < v) c *= 2;
  return c;
}

void SyncOmpThreads() {
  const int want =
      t_omp_override > 0 ? t_omp_override : ThreadPool::Global().num_threads();
  if (want != t_omp_threads) {
    omp_set_num_threads(want);
    t_omp_threads = want;
  }
}

using internal::ScopedSingleThreadedGemm;

std::atomic<bool> g_force_matmul{false};
std::atomic<int64_t> g_primitives_created{0};
// Largest bf16 operand panel widened to fp32 at once (elements): 16 MiB.
std::atomic<int64_t> g_widen_panel{int64_t{4} << 20};

// C = beta * C (beta == 0 writes zeros without reading C).
void ScaleC(float beta, float* c, int64_t m, int64_t n, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + n, 0.0f);
    } else if (beta != 1.0f) {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

void CheckLeadingDims(const char* op, bool trans_a, bool trans_b, int64_t m,
                      int64_t n, int64_t k, int64_t lda, int64_t ldb,
                      int64_t ldc) {
  CHECK(m >= 0 && n >= 0 && k >= 0)
      << op << ": negative size m=" << m << " n=" << n << " k=" << k;
  CHECK_GE(lda, std::max<int64_t>(1, trans_a ? m : k)) << op << ": lda";
  CHECK_GE(ldb, std::max<int64_t>(1, trans_b ? k : n)) << op << ": ldb";
  CHECK_GE(ldc, std::max<int64_t>(1, n)) << op << ": ldc";
}

// ---- B in oneDNN's bf16 brgemm layout ---------------------------------------

// oneDNN 2.6's bf16 brgemm takes B in "BA16a64b2a": 64-column blocks of all
// k rows (k rounded up to 32, n to 64, the padding zero), and inside a block
// the two bf16 of each k pair side by side for each column (VNNI). In 32-bit
// words: word (p, j) of block nb, holding rows 2p and 2p + 1 of column
// 64 nb + j, is at nb * (kpad / 2) * 64 + p * 64 + j.
bool IsBrgemmBf16BLayout(const dnnl::memory::desc& md, int64_t k, int64_t n) {
  const dnnl_memory_desc_t& d = md.data;
  const int64_t kpad = (k + 31) / 32 * 32, npad = (n + 63) / 64 * 64;
  if (d.ndims != 2 || d.data_type != dnnl_bf16 ||
      d.format_kind != dnnl_blocked || d.offset0 != 0 ||
      d.padded_dims[0] != kpad || d.padded_dims[1] != npad) {
    return false;
  }
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  return b.inner_nblks == 3 && b.inner_blks[0] == 16 && b.inner_idxs[0] == 0 &&
         b.inner_blks[1] == 64 && b.inner_idxs[1] == 1 &&
         b.inner_blks[2] == 2 && b.inner_idxs[2] == 0 &&
         b.strides[0] == 32 * 64 && b.strides[1] == kpad * 64;
}

// Words (p, j) of one block from a row-major B (k x n): row 2p's and row
// 2p + 1's element of each column, side by side.
void PackBlockFromRows(const uint16_t* b, int64_t ldb, int64_t k, int64_t kpad,
                       int64_t cols, uint32_t* out) {
  for (int64_t p = 0; p < kpad / 2; ++p, out += 64) {
    const int64_t r = 2 * p;
    if (r >= k) {
      std::memset(out, 0, 64 * sizeof(uint32_t));
      continue;
    }
    const uint16_t* lo = b + r * ldb;
    if (r + 1 < k) {
      const uint16_t* hi = lo + ldb;
      for (int64_t j = 0; j < cols; ++j) {
        out[j] = uint32_t{lo[j]} | (uint32_t{hi[j]} << 16);
      }
    } else {
      for (int64_t j = 0; j < cols; ++j) out[j] = lo[j];
    }
    for (int64_t j = cols; j < 64; ++j) out[j] = 0;
  }
}

// 8 x 8 transpose of 32-bit words: in rows at stride in_ld, out rows at
// stride 64.
inline void Transpose8x8Words(const uint32_t* in, int64_t in_ld,
                              uint32_t* out) {
  __m256i r[8], t[8];
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i * in_ld));
  }
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_permute2x128_si256(r[i], r[i + 4], 0x20);
    t[i + 4] = _mm256_permute2x128_si256(r[i], r[i + 4], 0x31);
  }
  for (int i = 0; i < 8; ++i) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * 64), t[i]);
  }
}

// Words (p, j) of one block from B given transposed (w: n x k, row-major):
// the k pair (2p, 2p + 1) of row j of w is its p-th 32-bit word already.
void PackBlockFromTransposed(const uint16_t* w, int64_t ldw, int64_t k,
                             int64_t kpad, int64_t cols, uint32_t* out) {
  const int64_t full_pairs = k / 2;  // Pairs with both rows inside k.
  // Whole 8 x 8 tiles through registers where the rows can be read as words.
  const bool words = ldw % 2 == 0;
  const int64_t tiled_p = words ? full_pairs / 8 * 8 : 0;
  const int64_t tiled_j = words ? cols / 8 * 8 : 0;
  for (int64_t j0 = 0; j0 < tiled_j; j0 += 8) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(w + j0 * ldw);
    for (int64_t p0 = 0; p0 < tiled_p; p0 += 8) {
      Transpose8x8Words(src + p0, ldw / 2, out + p0 * 64 + j0);
    }
  }
  for (int64_t p = 0; p < kpad / 2; ++p) {
    uint32_t* row = out + p * 64;
    const int64_t j_from = p < tiled_p ? tiled_j : 0;
    for (int64_t j = j_from; j < cols; ++j) {
      const uint16_t* e = w + j * ldw + 2 * p;
      if (p < full_pairs) {
        uint16_t pair[2];
        std::memcpy(pair, e, sizeof(pair));
        row[j] = uint32_t{pair[0]} | (uint32_t{pair[1]} << 16);
      } else {
        row[j] = 2 * p < k ? uint32_t{e[0]} : 0;
      }
    }
    for (int64_t j = cols; j < 64; ++j) row[j] = 0;
  }
}

// op(B) (k x n; b is n x k when trans_b) into the layout above, one
// 64-column block per task.
void PackBrgemmBf16B(const BFloat16* b, bool trans_b, int64_t k, int64_t n,
                     int64_t ldb, void* packed) {
  const int64_t kpad = (k + 31) / 32 * 32;
  const int64_t blocks = (n + 63) / 64;
  const uint16_t* src = reinterpret_cast<const uint16_t*>(b);
  uint32_t* dst = static_cast<uint32_t*>(packed);
  ThreadPool::Global().ParallelFor(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb) {
      const int64_t cols = std::min<int64_t>(64, n - nb * 64);
      uint32_t* out = dst + nb * (kpad / 2) * 64;
      if (trans_b) {
        PackBlockFromTransposed(src + nb * 64 * ldb, ldb, k, kpad, cols, out);
      } else {
        PackBlockFromRows(src + nb * 64, ldb, k, kpad, cols, out);
      }
    }
  });
}

// ---- oneDNN matmul primitives, cached per shape ----------------------------

// Input dtype, output dtype, transposes, m, n, k, lda, ldb, ldc, alpha, beta,
// whether B is packed first.
using MatmulKey = std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t,
                             int64_t, int64_t, int64_t, float, float, bool>;

// A primitive with its scratchpad's layout. The scratchpad is the caller's
// (scratchpad_mode::user, one buffer per thread): with oneDNN's own,
// threads executing one primitive at once ran at a third of its rate each
// (two threads, one 2048 x 512 x 512 bf16 shape: 120 against 370 GFLOP/s
// alone or in separate processes).
// pack_b (where defined) reorders B into the layout the primitive was made
// for (its weights_desc, packed_b) before each call.
struct CachedMatmul {
  dnnl::matmul prim;
  dnnl::memory::desc scratchpad;
  dnnl::reorder pack_b;
  dnnl::memory::desc packed_b;
  bool pack_b_ourselves = false;  // packed_b is IsBrgemmBf16BLayout's.
};

// bf16 GEMMs with at least this many rows take B packed once up front
// (fixed-shape primitives; runtime_dims ones take B as it is). oneDNN 2.6's
// brgemm matmul given a plain B packs it into its VNNI blocks again for each
// block of rows: its copy_b kernels were 6.7% of a `train --preset bench
// --bf16` iteration (perf with DNNL_JIT_PROFILE=2). PackBrgemmBf16B writes the
// same blocks once (0.7% of the iteration); oneDNN's own reorder (the
// fallback for any other layout) took 2.7%. bench --cpu_time, one thread, the
// bench preset's shapes and 1024^3: 0-9% faster than oneDNN with the plain B
// at 512 to 8192 rows; the same bytes (the same kernel on the same blocks).
// Fewer rows were not measured.
std::atomic<int64_t> g_pack_b_min_rows{512};

struct MatmulCache {
  std::mutex mu;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  absl::flat_hash_map<MatmulKey, std::shared_ptr<const CachedMatmul>> prims;
};

MatmulCache& Cache() {
  static auto* cache = new MatmulCache;
  return *cache;
}

// c (m x n, row stride ldc) is fp32 unless c_dt says otherwise (a bf16 c is
// rounded once from the fp32 accumulators, as F32ToBF16 would).
// With runtime_dims, one primitive serves every m, k and leading dimension
// of its n (the grouped GEMM's experts, whose rows change every step: a
// primitive per exact shape was created, ~0.3 ms, at each new row count, and
// kept for the life of the process). oneDNN 2.6 runs such a primitive
// through its jit bf16 GEMM, measured as fast as the brgemm kernel of a
// fixed shape or faster (one thread, 61-1024 rows).
void MatmulPrimitive(
    dnnl::memory::data_type dt, bool trans_a, bool trans_b, int64_t m,
    int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
    const void* b, int64_t ldb, float beta, void* c, int64_t ldc,
    dnnl::memory::data_type c_dt = dnnl::memory::data_type::f32,
    bool runtime_dims = false) {
  using dims = dnnl::memory::dims;
  MatmulCache& cache = Cache();
  const dnnl::memory::desc a_md({m, k}, dt,
                                trans_a ? dims{1, lda} : dims{lda, 1});
  const dnnl::memory::desc b_md({k, n}, dt,
                                trans_b ? dims{1, ldb} : dims{ldb, 1});
  const dnnl::memory::desc c_md({m, n}, c_dt, dims{ldc, 1});
  constexpr int64_t kAny = DNNL_RUNTIME_DIM_VAL;
  const bool pack_b = dt == dnnl::memory::data_type::bf16 && !runtime_dims &&
                      m >= g_pack_b_min_rows.load(std::memory_order_relaxed);
  const MatmulKey key(static_cast<int>(dt), static_cast<int>(c_dt), trans_a,
                      trans_b, runtime_dims ? kAny : m, n,
                      runtime_dims ? kAny : k, runtime_dims ? kAny : lda,
                      runtime_dims ? kAny : ldb, runtime_dims ? kAny : ldc,
                      alpha, beta, pack_b);
  std::shared_ptr<const CachedMatmul> prim;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.prims.find(key);
    if (it != cache.prims.end()) prim = it->second;
  }
  if (prim == nullptr) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::desc desc =
        runtime_dims
            ? dnnl::matmul::desc(
                  dnnl::memory::desc({kAny, kAny}, dt,
                                     trans_a ? dims{1, kAny} : dims{kAny, 1}),
                  dnnl::memory::desc({kAny, n}, dt,
                                     trans_b ? dims{1, kAny} : dims{kAny, 1}),
                  dnnl::memory::desc({kAny, n}, c_dt, dims{kAny, 1}))
            : dnnl::matmul::desc(a_md, b_md, c_md);
    const dnnl::matmul::primitive_desc pd =
        pack_b ? dnnl::matmul::primitive_desc(
                     dnnl::matmul::desc(
                         a_md,
                         dnnl::memory::desc({k, n}, dt,
                                            dnnl::memory::format_tag::any),
                         c_md),
                     attr, cache.engine)
               : dnnl::matmul::primitive_desc(desc, attr, cache.engine);
    CachedMatmul made{dnnl::matmul(pd), pd.scratchpad_desc()};
    if (pack_b && pd.weights_desc() != b_md) {
      made.packed_b = pd.weights_desc();
      made.pack_b_ourselves = IsBrgemmBf16BLayout(made.packed_b, k, n);
      made.pack_b = dnnl::reorder(dnnl::reorder::primitive_desc(
          cache.engine, b_md, cache.engine, made.packed_b));
    }
    prim = std::make_shared<const CachedMatmul>(std::move(made));
    g_primitives_created.fetch_add(1);
    std::lock_guard<std::mutex> lock(cache.mu);
    cache.prims.emplace(key, prim);
  }
  thread_local std::unique_ptr<dnnl::stream> stream;
  if (stream == nullptr) stream = std::make_unique<dnnl::stream>(cache.engine);
  dnnl::memory am(a_md, cache.engine, const_cast<void*>(a));
  dnnl::memory bm(b_md, cache.engine, const_cast<void*>(b));
  dnnl::memory cm(c_md, cache.engine, c);
  thread_local std::vector<uint8_t> scratch;
  const size_t scratch_bytes = prim->scratchpad.get_size();
  if (scratch.size() < scratch_bytes) scratch.resize(scratch_bytes);
  dnnl::memory sm(prim->scratchpad, cache.engine, scratch.data());
  if (prim->packed_b) {
    // One buffer per thread, as the scratchpad (the largest B so far: 8 MiB
    // for the bench preset's logits), at a 64-byte boundary.
    thread_local std::vector<uint8_t> packed_buffer;
    const size_t packed_bytes = prim->packed_b.get_size();
    if (packed_buffer.size() < packed_bytes + 64) {
      packed_buffer.resize(packed_bytes + 64);
    }
    void* packed = packed_buffer.data() +
                   (-reinterpret_cast<uintptr_t>(packed_buffer.data()) & 63);
    dnnl::memory pm(prim->packed_b, cache.engine, packed);
    if (prim->pack_b_ourselves) {
      PackBrgemmBf16B(static_cast<const BFloat16*>(b), trans_b, k, n, ldb,
                      packed);
    } else {
      prim->pack_b.execute(*stream, bm, pm);
    }
    bm = pm;
  }
  prim->prim.execute(*stream, {{DNNL_ARG_SRC, am},
                               {DNNL_ARG_WEIGHTS, bm},
                               {DNNL_ARG_DST, cm},
                               {DNNL_ARG_SCRATCHPAD, sm}});
  stream->wait();
}

// oneDNN has bf16 kernels (AVX512-BF16 or AMX) on this CPU.
bool DetectNativeBf16() {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & bf16) == bf16;
}

const char* DetectNativeBf16Isa() {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const unsigned amx = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_amx);
  if ((isa & amx) == amx) return "AMX";
  return DetectNativeBf16() ? "AVX512-BF16" : "none";
}

Bf16PathPolicy PolicyFromEnv() {
  const char* v = std::getenv("MCC_BF16_GEMM_PATH");
  if (v == nullptr || *v == '\0' || std::string(v) == "auto") {
    return Bf16PathPolicy::kAuto;
  }
  if (std::string(v) == "native") return Bf16PathPolicy::kNative;
  if (std::string(v) == "widened") return Bf16PathPolicy::kWidened;
  LOG(FATAL) << "MCC_BF16_GEMM_PATH must be auto, native or widened, got '" << v
             << "'";
  return Bf16PathPolicy::kAuto;
}

std::atomic<int> g_policy{-1};  // -1: not read from the environment yet.

Bf16PathPolicy CurrentPolicy() {
  int p = g_policy.load(std::memory_order_acquire);
  if (p < 0) {
    int expected = -1;
    g_policy.compare_exchange_strong(expected,
                                     static_cast<int>(PolicyFromEnv()));
    p = g_policy.load(std::memory_order_acquire);
  }
  return static_cast<Bf16PathPolicy>(p);
}

// Widens a rows x cols bf16 or fp16 matrix (row stride ld) into a dense fp32
// one.
template <typename T>
void WidenMatrix(const T* src, int64_t rows, int64_t cols, int64_t ld,
                 float* dst) {
  const int64_t grain =
      std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cols));
  ThreadPool::Global().ParallelFor(rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      LoadF32(src + r * ld, dst + r * cols, cols);
  });
}

}  // namespace

const char* GemmPathName(GemmPath path) {
  switch (path) {
    case GemmPath::kConvertToF32:
      return "widened";
    case GemmPath::kNativeBF16:
      return "native";
  }
  return "?";
}

bool NativeBf16Available() {
  static const bool available = DetectNativeBf16();
  return available;
}

const char* NativeBf16Isa() {
  static const char* isa = DetectNativeBf16Isa();
  return isa;
}

void GemmF32(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc) {
  CheckLeadingDims("GemmF32", trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    ScaleC(beta, c, m, n, ldc);
    return;
  }
  SyncOmpThreads();
  if (g_force_matmul.load(std::memory_order_relaxed)) {
    MatmulPrimitive(dnnl::memory::data_type::f32, trans_a, trans_b, m, n, k,
                    alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const dnnl_status_t st =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                 lda, b, ldb, beta, c, ldc);
  CHECK_EQ(st, dnnl_success)
      << "dnnl_sgemm failed for m=" << m << " n=" << n << " k=" << k;
}

namespace {

// op(A) op(B) for bf16 or fp16 operands through the fp32 GEMM, after the
// checks and early returns of the callers.
template <typename T>
void GemmWidened(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const T* a, int64_t lda, const T* b, int64_t ldb,
                 float beta, float* c, int64_t ldc) {
  // Widen panels of at most g_widen_panel elements (m-panels of A, n-panels
  // of B) into per-thread scratch, so a large operand (an LM head's
  // [vocab, hidden] weight) never needs a whole fp32 copy. B is widened once
  // per panel pair; that costs k*nb against 2*mb*nb*k flops of GEMM.
  thread_local std::vector<float> a32, b32;
  const int64_t panel = std::max<int64_t>(1, g_widen_panel.load());
  const int64_t mb = std::max<int64_t>(1, std::min(m, panel / k));
  const int64_t nb = std::max<int64_t>(1, std::min(n, panel / k));
  if (static_cast<int64_t>(a32.size()) < mb * k) a32.resize(mb * k);
  if (static_cast<int64_t>(b32.size()) < nb * k) b32.resize(nb * k);
  for (int64_t m0 = 0; m0 < m; m0 += mb) {
    const int64_t mm = std::min(mb, m - m0);
    // op(A) rows [m0, m0 + mm): stored rows (no trans) or columns (trans).
    if (trans_a) {
      WidenMatrix(a + m0, k, mm, lda, a32.data());  // k x mm, ld mm
    } else {
      WidenMatrix(a + m0 * lda, mm, k, lda, a32.data());  // mm x k, ld k
    }
    for (int64_t n0 = 0; n0 < n; n0 += nb) {
      const int64_t nn = std::min(nb, n - n0);
      if (trans_b) {
        WidenMatrix(b + n0 * ldb, nn, k, ldb, b32.data());  // nn x k, ld k
      } else {
        WidenMatrix(b + n0, k, nn, ldb, b32.data());  // k x nn, ld nn
      }
      GemmF32(trans_a, trans_b, mm, nn, k, alpha, a32.data(), trans_a ? mm : k,
              b32.data(), trans_b ? k : nn, beta, c + m0 * ldc + n0, ldc);
    }
  }
}

// c is fp32, or bf16 when c_dt says so (rounded once by oneDNN).
void GemmNativeBf16(
    bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
    const BFloat16* a, int64_t lda, const BFloat16* b, int64_t ldb, float beta,
    void* c, int64_t ldc,
    dnnl::memory::data_type c_dt = dnnl::memory::data_type::f32) {
  SyncOmpThreads();
  // Row counts that change call by call (ScopedBf16ShapeClass) share one
  // primitive.
  MatmulPrimitive(dnnl::memory::data_type::bf16, trans_a, trans_b, m, n, k,
                  alpha, a, lda, b, ldb, beta, c, ldc, c_dt,
                  /*runtime_dims=*/t_bf16_shape_class);
}

// Below this many flops a GEMM takes microseconds: measuring would cost more
// than any difference, and the widened path needs no primitive, so it runs
// widened.
constexpr double kMinTunedFlops = 1 << 22;
// The native path must beat the widened one by this factor to be chosen: the
// widened path is the reference (plain fp32 arithmetic on exact widened
// inputs), and a margin keeps timing noise from flipping the choice between
// runs of the same job.
constexpr double kNativeMargin = 0.9;

struct Bf16ChoiceTable {
  std::mutex mu;       // Guards choices and order.
  std::mutex tune_mu;  // One measurement at a time (they would compete).
  absl::flat_hash_map<Bf16GemmShape, Bf16GemmChoice> choices;
  std::vector<Bf16GemmShape> order;  // First-use order, for reports.
};

Bf16ChoiceTable& Choices() {
  static auto* table = new Bf16ChoiceTable;
  return *table;
}

int CurrentGemmThreads() {
  return t_omp_override > 0 ? t_omp_override
                            : ThreadPool::Global().num_threads();
}

// Times both paths on the call's own operands into scratch (so c and its
// beta are untouched), alternating, best of a few runs each (seen before:
// bf16 2048 x 512 x 512 NT widened at 250 GFLOP/s against native at 488 on
// a loaded 2-core machine, timed by wall clock).
// m, n, k: the call's own (shape may hold their classes).
Bf16GemmChoice MeasureBf16Paths(const Bf16GemmShape& shape, int64_t m,
                                int64_t n, int64_t k, float alpha,
                                const BFloat16* a, int64_t lda,
                                const BFloat16* b, int64_t ldb) {
  std::vector<float> scratch(static_cast<size_t>(m * n));
  auto native = [&] {
    GemmNativeBf16(shape.trans_a, shape.trans_b, m, n, k, alpha, a, lda, b, ldb,
                   0.0f, scratch.data(), n);
  };
  auto widened = [&] {
    GemmWidened(shape.trans_a, shape.trans_b, m, n, k, alpha, a, lda, b, ldb,
                0.0f, scratch.data(), n);
  };
  // A GEMM on one thread runs on this thread alone: its CPU time is the
  // work, where wall time also counts the time other jobs held the core (on
  // a loaded machine a path timed during a preemption lost for the whole
  // process: native measured at 59 GFLOP/s against its usual 460).
  // oneDNN's team of several threads is timed by wall clock.
  const bool cpu_clock = shape.threads == 1;
  auto now = [cpu_clock] {
    if (cpu_clock) {
      timespec ts;
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return ts.tv_sec + 1e-9 * ts.tv_nsec;
    }
    return std::chrono::duration<double>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  auto seconds = [&now](const auto& fn) {
    const double t0 = now();
    fn();
    return now() - t0;
  };
  // The first runs create the primitive and grow the scratch panels.
  const double warm = seconds(native) + seconds(widened);
  const int reps =
      static_cast<int>(std::clamp(0.04 / std::max(warm, 1e-9), 2.0, 5.0));
  double t_native = 1e30, t_widened = 1e30;
  for (int r = 0; r < reps; ++r) {
    t_native = std::min(t_native, seconds(native));
    t_widened = std::min(t_widened, seconds(widened));
  }
  Bf16GemmChoice choice;
  choice.shape = shape;
  choice.measured = true;
  const double flops = 2.0 * m * n * k;
  choice.native_gflops = flops / t_native / 1e9;
  choice.widened_gflops = flops / t_widened / 1e9;
  choice.path = t_native < kNativeMargin * t_widened ? GemmPath::kNativeBF16
                                                     : GemmPath::kConvertToF32;
  return choice;
}

GemmPath ChooseBf16Path(bool trans_a, bool trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, const BFloat16* a, int64_t lda,
                        const BFloat16* b, int64_t ldb) {
  if (!NativeBf16Available()) return GemmPath::kConvertToF32;
  switch (CurrentPolicy()) {
    case Bf16PathPolicy::kNative:
      return GemmPath::kNativeBF16;
    case Bf16PathPolicy::kWidened:
      return GemmPath::kConvertToF32;
    case Bf16PathPolicy::kAuto:
      break;
  }
  if (2.0 * m * n * k < kMinTunedFlops) return GemmPath::kConvertToF32;
  const Bf16GemmShape shape =
      t_bf16_shape_class
          ? Bf16GemmShape{trans_a,
                          trans_b,
                          RoundUpToPowerOfTwo(m),
                          RoundUpToPowerOfTwo(n),
                          RoundUpToPowerOfTwo(k),
                          CurrentGemmThreads()}
          : Bf16GemmShape{trans_a, trans_b, m, n, k, CurrentGemmThreads()};
  Bf16ChoiceTable& table = Choices();
  {
    std::lock_guard<std::mutex> lock(table.mu);
    auto it = table.choices.find(shape);
    if (it != table.choices.end()) return it->second.path;
  }
  std::lock_guard<std::mutex> tune_lock(table.tune_mu);
  {
    // Another thread may have measured this shape while we waited.
    std::lock_guard<std::mutex> lock(table.mu);
    auto it = table.choices.find(shape);
    if (it != table.choices.end()) return it->second.path;
  }
  const Bf16GemmChoice choice =
      MeasureBf16Paths(shape, m, n, k, alpha, a, lda, b, ldb);
  static std::once_flag logged;
  std::call_once(logged, [] {
    LOG(INFO) << "bf16 GEMMs: choosing per shape between oneDNN's native bf16 "
                 "matmul ("
              << NativeBf16Isa()
              << ") and fp32 sgemm on widened copies, by timing both on first "
                 "use (MCC_BF16_GEMM_PATH=native|widened pins one)";
  });
  VLOG(1) << "bf16 GEMM " << FormatBf16GemmChoice(choice);
  std::lock_guard<std::mutex> lock(table.mu);
  table.choices.emplace(shape, choice);
  table.order.push_back(shape);
  return choice.path;
}

}  // namespace

void GemmBF16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
              float alpha, const BFloat16* a, int64_t lda, const BFloat16* b,
              int64_t ldb, float beta, float* c, int64_t ldc) {
  CheckLeadingDims("GemmBF16", trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    ScaleC(beta, c, m, n, ldc);
    return;
  }
  if (ChooseBf16Path(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb) ==
      GemmPath::kNativeBF16) {
    GemmNativeBf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                   ldc);
    return;
  }
  GemmWidened(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void GemmF16(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
             float alpha, const Float16* a, int64_t lda, const Float16* b,
             int64_t ldb, float beta, float* c, int64_t ldc) {
  CheckLeadingDims("GemmF16", trans_a, trans_b, m, n, k, lda, ldb, ldc);
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {
    ScaleC(beta, c, m, n, ldc);
    return;
  }
  GemmWidened(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {

struct GemmDims {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  bool b_shared = false;  // 2-D b used by every batch entry.
};

// The sizes of a (batched) GEMM whose ranks are checked; k is op(a)'s.
GemmDims DimsOf(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                bool batched) {
  GemmDims d;
  const int ao = batched ? 1 : 0;
  const int bo = b.dim() == 3 ? 1 : 0;
  d.batch = batched ? a.size(0) : 1;
  d.b_shared = batched && b.dim() == 2;
  d.m = trans_a ? a.size(ao + 1) : a.size(ao);
  d.k = trans_a ? a.size(ao) : a.size(ao + 1);
  d.n = trans_b ? b.size(bo) : b.size(bo + 1);
  return d;
}

absl::Status ValidateGemm(const char* op, const Tensor& a, bool trans_a,
                          const Tensor& b, bool trans_b, const Tensor* c,
                          bool batched, GemmDims* d) {
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"a", &a}, {"b", &b}, {"c", c}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"a", &a}, {"b", &b}, {"c", c}}));
  const int want = batched ? 3 : 2;
  const std::string ab = absl::StrCat("a ", Brief(a), " and b ", Brief(b));
  if (a.dim() != want || (b.dim() != want && !(batched && b.dim() == 2))) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", ab, ": expected ",
                     batched ? "3-D a and 3-D or 2-D b" : "2-D matrices"));
  }
  if (a.dtype() != b.dtype() ||
      (a.dtype() != DType::kFloat32 && a.dtype() != DType::kBFloat16 &&
       a.dtype() != DType::kFloat16)) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", ab, ": a and b must both be fp32, both bf16 or both fp16"));
  }
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"c", c}));
  *d = DimsOf(a, trans_a, b, trans_b, batched);
  const int bo = b.dim() == 3 ? 1 : 0;
  const int64_t kb = trans_b ? b.size(bo + 1) : b.size(bo);
  if (d->k != kb) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", ab, " (trans_a=", trans_a, ", trans_b=", trans_b,
                     "): inner dimensions differ (", d->k, " vs ", kb, ")"));
  }
  if (batched && b.dim() == 3 && b.size(0) != d->batch) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", ab, ": batch sizes differ"));
  }
  const Shape want_c =
      batched ? Shape{d->batch, d->m, d->n} : Shape{d->m, d->n};
  if (c->shape() != want_c) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": c ", Brief(*c), " should be ", ShapeToString(want_c), " for ",
        ab, " (trans_a=", trans_a, ", trans_b=", trans_b, ")"));
  }
  return absl::OkStatus();
}

// The calling thread's fp32 staging for a 16-bit output, kept between calls
// and never zeroed: a fresh buffer would be zero-filled, and often
// page-faulted, on every call (64 MiB for the bench preset's logits).
float* OutputStaging(int64_t elements) {
  thread_local std::unique_ptr<float[]> buffer;
  thread_local int64_t capacity = 0;
  if (capacity < elements) {
    buffer.reset();
    buffer.reset(new float[elements]);
    capacity = elements;
  }
  return buffer.get();
}

// Runs a validated (batched) GEMM on CPU tensors.
void RunCpuGemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                Tensor* c, float alpha, float beta, const GemmDims& d) {
  const int64_t m = d.m, n = d.n, k = d.k;
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  const int64_t a_stride = m * k, b_stride = d.b_shared ? 0 : k * n;
  const int64_t c_stride = m * n;
  if (d.batch == 1 && k > 0 && a.dtype() == DType::kBFloat16 &&
      c->dtype() == DType::kBFloat16 &&
      ChooseBf16Path(trans_a, trans_b, m, n, k, alpha, a.data<BFloat16>(), lda,
                     b.data<BFloat16>(), ldb) == GemmPath::kNativeBF16) {
    // oneDNN writes the bf16 result itself: no fp32 staging pass.
    GemmNativeBf16(trans_a, trans_b, m, n, k, alpha, a.data<BFloat16>(), lda,
                   b.data<BFloat16>(), ldb, beta, c->data<BFloat16>(), n,
                   dnnl::memory::data_type::bf16);
    return;
  }
  // fp32 destination: c itself, or staging for a 16-bit c.
  float* out;
  if (c->dtype() == DType::kFloat32) {
    out = c->data<float>();
  } else {
    out = OutputStaging(c->numel());
    if (beta != 0.0f) LoadF32Any(*c, out);
  }
  auto run_one = [&](int64_t i) {
    if (a.dtype() == DType::kBFloat16) {
      GemmBF16(trans_a, trans_b, m, n, k, alpha,
               a.data<BFloat16>() + i * a_stride, lda,
               b.data<BFloat16>() + i * b_stride, ldb, beta, out + i * c_stride,
               n);
    } else if (a.dtype() == DType::kFloat16) {
      GemmF16(trans_a, trans_b, m, n, k, alpha,
              a.data<Float16>() + i * a_stride, lda,
              b.data<Float16>() + i * b_stride, ldb, beta, out + i * c_stride,
              n);
    } else {
      GemmF32(trans_a, trans_b, m, n, k, alpha, a.data<float>() + i * a_stride,
              lda, b.data<float>() + i * b_stride, ldb, beta,
              out + i * c_stride, n);
    }
  };
  ThreadPool& pool = ThreadPool::Global();
  const double flops = 2.0 * m * n * k;
  if (k == 0) {
    // An empty product: c = beta * c (zeros, c unread, for beta == 0). The
    // GEMM routines would reject the leading dimension of 0.
    ScaleC(beta, out, d.batch * m, n, n);
  } else if (d.batch > 1 && pool.num_threads() > 1 && flops < 8e6) {
    // Small matrices: one single-threaded GEMM per pool thread.
    pool.ParallelFor(d.batch, 1, [&](int64_t i0, int64_t i1) {
      ScopedSingleThreadedGemm single;
      for (int64_t i = i0; i < i1; ++i) run_one(i);
    });
  } else {
    for (int64_t i = 0; i < d.batch; ++i) run_one(i);
  }
  if (c->dtype() == DType::kBFloat16) {
    F32ToBF16(out, c->data<BFloat16>(), c->numel());
  } else if (c->dtype() == DType::kFloat16) {
    F32ToF16(out, c->data<Float16>(), c->numel());
  }
}

absl::Status GemmCpu(const Tensor& a, bool trans_a, const Tensor& b,
                     bool trans_b, Tensor* c, float alpha, float beta) {
  RunCpuGemm(a, trans_a, b, trans_b, c, alpha, beta,
             DimsOf(a, trans_a, b, trans_b, /*batched=*/false));
  return absl::OkStatus();
}

absl::Status BatchedGemmCpu(const Tensor& a, bool trans_a, const Tensor& b,
                            bool trans_b, Tensor* c, float alpha, float beta) {
  RunCpuGemm(a, trans_a, b, trans_b, c, alpha, beta,
             DimsOf(a, trans_a, b, trans_b, /*batched=*/true));
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(GemmKernel, GemmKernels, "Gemm", &GemmCpu);

MCC_KERNEL_SLOT(GemmKernel, BatchedGemmKernels, "BatchedGemm", &BatchedGemmCpu);

absl::Status Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                  Tensor* c, float alpha, float beta) {
  ScopedOpTimer op_timer("Gemm");
  GemmDims d;
  MCC_RETURN_IF_ERROR(
      ValidateGemm("Gemm", a, trans_a, b, trans_b, c, /*batched=*/false, &d));
  return GemmKernels()(a.device(), a, trans_a, b, trans_b, c, alpha, beta);
}

absl::Status BatchedGemm(const Tensor& a, bool trans_a, const Tensor& b,
                         bool trans_b, Tensor* c, float alpha, float beta) {
  ScopedOpTimer op_timer("BatchedGemm");
  GemmDims d;
  MCC_RETURN_IF_ERROR(ValidateGemm("BatchedGemm", a, trans_a, b, trans_b, c,
                                   /*batched=*/true, &d));
  return BatchedGemmKernels()(a.device(), a, trans_a, b, trans_b, c, alpha,
                              beta);
}

std::vector<Bf16GemmChoice> Bf16GemmChoices() {
  Bf16ChoiceTable& table = Choices();
  std::lock_guard<std::mutex> lock(table.mu);
  std::vector<Bf16GemmChoice> out;
  out.reserve(table.order.size());
  for (const Bf16GemmShape& s : table.order) out.push_back(table.choices[s]);
  return out;
}

std::string FormatBf16GemmChoice(const Bf16GemmChoice& c) {
  const Bf16GemmShape& s = c.shape;
  return absl::StrFormat(
      "m=%d n=%d k=%d %c%c (%d thread%s): native %.1f GFLOP/s, widened %.1f "
      "GFLOP/s -> %s",
      s.m, s.n, s.k, s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.threads,
      s.threads == 1 ? "" : "s", c.native_gflops, c.widened_gflops,
      GemmPathName(c.path));
}

namespace internal {

ScopedSingleThreadedGemm::ScopedSingleThreadedGemm() : saved_(t_omp_override) {
  t_omp_override = 1;
}
ScopedSingleThreadedGemm::~ScopedSingleThreadedGemm() {
  t_omp_override = saved_;
}

ScopedBf16ShapeClass::ScopedBf16ShapeClass() : saved_(t_bf16_shape_class) {
  t_bf16_shape_class = true;
}

ScopedBf16ShapeClass::~ScopedBf16ShapeClass() { t_bf16_shape_class = saved_; }

Bf16PathPolicy CurrentBf16PathPolicy() { return CurrentPolicy(); }

void SyncGemmOmpThreads() { SyncOmpThreads(); }

bool SetForceMatmulPrimitiveForTesting(bool force) {
  return g_force_matmul.exchange(force);
}

int64_t MatmulPrimitivesCreated() { return g_primitives_created.load(); }

int64_t SetBf16PackBMinRowsForTesting(int64_t rows) {
  return g_pack_b_min_rows.exchange(rows);
}

Bf16PathPolicy SetBf16PathPolicyForTesting(Bf16PathPolicy policy) {
  CurrentPolicy();  // Reads the environment first, so it cannot override.
  return static_cast<Bf16PathPolicy>(
      g_policy.exchange(static_cast<int>(policy)));
}

void ClearBf16GemmChoicesForTesting() {
  Bf16ChoiceTable& table = Choices();
  std::lock_guard<std::mutex> lock(table.mu);
  table.choices.clear();
  table.order.clear();
}

int64_t SetBf16WidenPanelForTesting(int64_t elements) {
  return g_widen_panel.exchange(elements);
}

}  // namespace internal
}  // namespace ops
}  // namespace mcc
