// Device code of the flash-attention kernels (FlashAttention-2 tiling, fp32
// arithmetic in shared memory, SIMT), kept apart from the launchers in
// flash_attention.cu so that a host-only emulator (cuda_emulator.h) can run
// the same kernels in CI on a machine without a GPU.
//
// The includer provides, before including this file:
//   internal::LoadAs / internal::StoreAs (kernel_util.cuh: element i of a
//     run-time typed float array as fp32, and rounding to nearest even);
//   flash::SharedFloats(): the block's dynamic shared memory as floats;
// and CUDA's thread indices, __syncthreads, __shfl_xor_sync, expf, logf.
//
// Layout: q, out, dout [b, s, hq, d]; k, v [b, s, hkv, d]; lse and the row
// terms D [b, hq, s] fp32. Query head h reads kv head h / (hq / hkv).
//
// Threads: a block of 256 threads works on a tile of rows; thread t owns
// the kR rows (t / 8) * kR .. + kR - 1 of the tile and, within them, the
// columns t % 8 + 8 c (scores and outputs alike), so a row's statistics
// are reduced over 8 neighbouring lanes of one warp with shuffles. Tiles
// are stored as fp32 with a row stride of width + 1 floats, so the reads
// of the inner products hit distinct shared-memory banks.
//
// Kernels (none materialises [s, s]; none uses atomics, so every result is
// the same run to run):
//   ForwardKernel: one block per (query tile, head, batch entry): online
//     softmax over key tiles, O and the logsumexp written at the end.
//   RowDotKernel: D[b, h, i] = sum_x dout * out (one warp per row).
//   KvGradKernel: one block per (key tile, kv head, batch entry): loops over
//     the query heads of the kv head's group and their query tiles, and
//     accumulates dK and dV in registers (the GQA sum in a fixed order).
//   QGradKernel: one block per (query tile, head, batch entry): recomputes
//     P and dP and accumulates dQ (so dQ needs no atomics across key tiles).
#ifndef CORE_OPS_CUDA_FLASH_ATTENTION_KERNELS_CUH_
#define CORE_OPS_CUDA_FLASH_ATTENTION_KERNELS_CUH_

#include <cstddef>
#include <cstdint>

#include "core/ops/cuda/elem_type.h"
#include "core/ops/cuda/flash_attention_args.h"

#ifndef MCC_FA_UNROLL
#define MCC_FA_UNROLL _Pragma("unroll")
#endif

namespace mcc {
namespace cuda_kernels {
namespace flash {

// Everything a kernel reads: pointers, types, sizes and options.
struct Params {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  ElemType qt = ElemType::kF32;  // q, k and v
  // Forward: written; backward: read (out and dout share ot).
  void* out = nullptr;
  const void* dout = nullptr;
  ElemType ot = ElemType::kF32;
  float* lse = nullptr;   // [b, hq, s]
  float* drow = nullptr;  // [b, hq, s], the backward's D
  void* dq = nullptr;
  ElemType dqt = ElemType::kF32;
  void* dk = nullptr;
  void* dv = nullptr;
  ElemType dkt = ElemType::kF32;  // dk and dv
  int64_t b = 0, s = 0, hq = 0, hkv = 0, d = 0;
  float scale = 1.0f;
  bool causal = true;
  // Attention dropout (core/ops/attention.h): probability (b, h, i, j) is
  // kept when word offset + ((b * total_heads + head_offset + h) * s + i) *
  // s + j of seed's Philox stream, shifted right by 8, is >= threshold;
  // kept probabilities are multiplied by keep_scale.
  bool dropout = false;
  uint32_t threshold = 0;
  float keep_scale = 1.0f;
  uint64_t seed = 0, offset = 0;
  int64_t head_offset = 0, total_heads = 0;
  // Packed documents / sliding windows (AttentionOptions::first_key), int32
  // [b, s] in device memory: query i of batch entry bi sees keys j >=
  // first_key[bi * s + i] only. Null: none.
  const int32_t* first_key = nullptr;
};

// The parameters of a launch (flash_attention.cu) from its arguments; the
// pointers, element types and (backward) D are the launcher's to add.
inline Params ParamsOf(const FlashAttentionArgs& a) {
  Params p;
  p.b = a.batch;
  p.s = a.seq;
  p.hq = a.heads;
  p.hkv = a.kv_heads;
  p.d = a.head_dim;
  p.scale = a.scale;
  p.causal = a.causal;
  p.dropout = a.dropout;
  p.threshold = a.threshold;
  p.keep_scale = a.keep_scale;
  p.seed = a.seed;
  p.offset = a.offset;
  p.head_offset = a.head_offset;
  p.total_heads = a.total_heads > 0 ? a.total_heads : a.heads;
  p.first_key = a.first_key;
  return p;
}

constexpr int kGroup = 8;  // Lanes that share a row.
constexpr int kThreads = 256;

// Tile shapes per padded head dimension kD (64, 128 or 256), chosen so the
// fp32 tiles fit the 163 KiB of shared memory an sm_80 block may opt into.
// kBr: query rows per tile, kBc: key rows per tile, kR: rows per thread.
template <int kD>
struct Shapes;
template <>
struct Shapes<64> {
  static constexpr int kFwdBr = 64, kFwdBc = 64, kFwdR = 2;
  static constexpr int kKvBc = 64, kKvBr = 64, kKvR = 2;
  static constexpr int kQBr = 64, kQBc = 64, kQR = 2;
};
template <>
struct Shapes<128> {
  static constexpr int kFwdBr = 64, kFwdBc = 64, kFwdR = 2;
  static constexpr int kKvBc = 64, kKvBr = 32, kKvR = 2;
  static constexpr int kQBr = 64, kQBc = 32, kQR = 2;
};
template <>
struct Shapes<256> {
  static constexpr int kFwdBr = 64, kFwdBc = 32, kFwdR = 2;
  static constexpr int kKvBc = 32, kKvBr = 32, kKvR = 1;
  static constexpr int kQBr = 32, kQBc = 32, kQR = 1;
};

// Shared-memory floats of each kernel (tiles of width kD + 1 and the score
// tiles of width + 1; the backward adds lse and D per query row).
template <int kD>
struct Smem {
  using S = Shapes<kD>;
  static constexpr int kLd = kD + 1;
  static constexpr size_t kForward =
      ((S::kFwdBr + 2 * S::kFwdBc) * kLd + S::kFwdBr * (S::kFwdBc + 1)) *
      sizeof(float);
  static constexpr size_t kKvGrad =
      ((2 * S::kKvBc + 2 * S::kKvBr) * kLd + 2 * S::kKvBc * (S::kKvBr + 1) +
       2 * S::kKvBr) *
      sizeof(float);
  static constexpr size_t kQGrad = ((2 * S::kQBr + 2 * S::kQBc) * kLd +
                                    S::kQBr * (S::kQBc + 1) + 2 * S::kQBr) *
                                   sizeof(float);
};

// Grids (x, y, z) of the kernels; every kernel runs kThreads threads.
struct Grid {
  unsigned int x, y, z;
};
template <int kD>
Grid ForwardGrid(const Params& p) {
  const int64_t tiles = (p.s + Shapes<kD>::kFwdBr - 1) / Shapes<kD>::kFwdBr;
  return {static_cast<unsigned int>(tiles), static_cast<unsigned int>(p.hq),
          static_cast<unsigned int>(p.b)};
}
template <int kD>
Grid KvGradGrid(const Params& p) {
  const int64_t tiles = (p.s + Shapes<kD>::kKvBc - 1) / Shapes<kD>::kKvBc;
  return {static_cast<unsigned int>(tiles), static_cast<unsigned int>(p.hkv),
          static_cast<unsigned int>(p.b)};
}
template <int kD>
Grid QGradGrid(const Params& p) {
  const int64_t tiles = (p.s + Shapes<kD>::kQBr - 1) / Shapes<kD>::kQBr;
  return {static_cast<unsigned int>(tiles), static_cast<unsigned int>(p.hq),
          static_cast<unsigned int>(p.b)};
}
inline Grid RowDotGrid(const Params& p) {
  int64_t blocks = (p.b * p.s * p.hq + kThreads / 32 - 1) / (kThreads / 32);
  if (blocks > 65536) blocks = 65536;
  if (blocks < 1) blocks = 1;
  return {static_cast<unsigned int>(blocks), 1, 1};
}

// The padded head dim of the kernels that serve head dim d (0 if none).
inline int PaddedHeadDim(int64_t d) {
  return d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : 0;
}

// ---- Philox (core/ops/dropout.h's stream) ----------------------------------

// Word w of seed's stream: word w % 4 of Philox4x32-10 block w / 4 with
// counter {lo32(w / 4), hi32(w / 4), 0, 0} and key {lo32(seed), hi32(seed)}.
__host__ __device__ __forceinline__ uint32_t PhiloxWord(uint64_t seed,
                                                        uint64_t w) {
  const uint64_t j = w / 4;
  uint32_t c0 = static_cast<uint32_t>(j), c1 = static_cast<uint32_t>(j >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed);
  uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * c0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  const uint32_t r = static_cast<uint32_t>(w % 4);
  return r == 0 ? c0 : r == 1 ? c1 : r == 2 ? c2 : c3;
}

// keep_scale or 0 for probability (bi, h, i, j) (Params::dropout).
__host__ __device__ __forceinline__ float DropFactor(const Params& p,
                                                     int64_t bi, int64_t h,
                                                     int64_t i, int64_t j) {
  const uint64_t head = static_cast<uint64_t>(bi) * p.total_heads +
                        static_cast<uint64_t>(p.head_offset + h);
  const uint64_t w =
      p.offset +
      (head * static_cast<uint64_t>(p.s) + static_cast<uint64_t>(i)) *
          static_cast<uint64_t>(p.s) +
      static_cast<uint64_t>(j);
  return (PhiloxWord(p.seed, w) >> 8) >= p.threshold ? p.keep_scale : 0.0f;
}

// ---- Helpers ----------------------------------------------------------------

// Max and sum over the kGroup lanes that share a row.
__device__ __forceinline__ float GroupMax(float v) {
  for (int o = kGroup / 2; o > 0; o >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float GroupSum(float v) {
  for (int o = kGroup / 2; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rows row0 .. row0 + kRows - 1 (of s) of one head of a [b, s, heads, d]
// tensor into dst [kRows, kD + 1] as fp32 times scale; rows past s and
// columns past d are zero. `base` is the element offset of (b, 0, head, 0),
// `stride` the elements between rows (heads * d). Consecutive threads read
// consecutive elements.
template <int kRows, int kD>
__device__ __forceinline__ void LoadTile(float* dst, const void* src,
                                         ElemType t, int64_t row0, int64_t s,
                                         int64_t base, int64_t stride, int d,
                                         float scale) {
  for (int e = threadIdx.x; e < kRows * kD; e += kThreads) {
    const int r = e / kD, x = e % kD;
    float val = 0.0f;
    if (row0 + r < s && x < d) {
      val = internal::LoadAs(src, t, base + (row0 + r) * stride + x) * scale;
    }
    dst[r * (kD + 1) + x] = val;
  }
}

// Rows row0 .. + kRows - 1 of one head's lse and D ([b, hq, s] at `base`).
template <int kRows>
__device__ __forceinline__ void LoadRowTerms(float* lse_s, float* d_s,
                                             const Params& p, int64_t base,
                                             int64_t row0) {
  for (int e = threadIdx.x; e < kRows; e += kThreads) {
    const int64_t i = row0 + e;
    lse_s[e] = i < p.s ? p.lse[base + i] : 0.0f;
    d_s[e] = i < p.s ? p.drow[base + i] : 0.0f;
  }
}

// Whether query i of batch entry bi may see key j.
__device__ __forceinline__ bool Visible(const Params& p, int64_t bi, int64_t i,
                                        int64_t j) {
  return i < p.s && j < p.s && (!p.causal || j <= i) &&
         (p.first_key == nullptr || j >= p.first_key[bi * p.s + i]);
}

// The smallest first key of query rows [i0, i0 + rows) (0 without
// first_key): key tiles ending at or below it are skipped. Every thread of
// a block computes the same value, so skipping keeps the block together.
__device__ __forceinline__ int64_t FirstKeyOfTile(const Params& p, int64_t bi,
                                                  int64_t i0, int64_t rows) {
  if (p.first_key == nullptr) return 0;
  int64_t least = p.s;
  for (int64_t i = i0; i < i0 + rows && i < p.s; ++i) {
    const int64_t f = p.first_key[bi * p.s + i];
    least = f < least ? f : least;
  }
  return least > 0 ? least : 0;
}

// ---- Forward ----------------------------------------------------------------

template <int kD>
__global__ void __launch_bounds__(kThreads) ForwardKernel(Params p) {
  using S = Shapes<kD>;
  constexpr int kBr = S::kFwdBr, kBc = S::kFwdBc, kR = S::kFwdR;
  static_assert(kBr / kR * kGroup == kThreads, "tile and threads disagree");
  constexpr int kLd = kD + 1, kLdp = kBc + 1;
  constexpr int kSc = kBc / kGroup;  // score columns per thread
  constexpr int kOc = kD / kGroup;   // output columns per thread
  float* qs = SharedFloats();
  float* ks = qs + kBr * kLd;
  float* vs = ks + kBc * kLd;
  float* ps = vs + kBc * kLd;
  const int tid = threadIdx.x, rg = tid / kGroup, cg = tid % kGroup;
  // The longest (last, when causal) query tiles first.
  const int64_t i0 = (gridDim.x - 1 - blockIdx.x) * int64_t{kBr};
  const int64_t h = blockIdx.y, bi = blockIdx.z;
  const int64_t kvh = h / (p.hq / p.hkv);
  const int d = static_cast<int>(p.d);
  const int64_t q_stride = p.hq * p.d, kv_stride = p.hkv * p.d;
  const int64_t q_base = bi * p.s * q_stride + h * p.d;
  const int64_t kv_base = bi * p.s * kv_stride + kvh * p.d;
  LoadTile<kBr, kD>(qs, p.q, p.qt, i0, p.s, q_base, q_stride, d, p.scale);

  float o[kR][kOc], m[kR], l[kR];
  MCC_FA_UNROLL
  for (int r = 0; r < kR; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    MCC_FA_UNROLL
    for (int c = 0; c < kOc; ++c) o[r][c] = 0.0f;
  }
  const int64_t kend = p.causal && i0 + kBr < p.s ? i0 + kBr : p.s;
  const int64_t kbegin = FirstKeyOfTile(p, bi, i0, kBr) / kBc * kBc;
  for (int64_t j0 = kbegin; j0 < kend; j0 += kBc) {
    __syncthreads();  // The previous tile's K, V and P are read.
    LoadTile<kBc, kD>(ks, p.k, p.qt, j0, p.s, kv_base, kv_stride, d, 1.0f);
    LoadTile<kBc, kD>(vs, p.v, p.qt, j0, p.s, kv_base, kv_stride, d, 1.0f);
    __syncthreads();
    float sc[kR][kSc];
    MCC_FA_UNROLL
    for (int r = 0; r < kR; ++r) {
      MCC_FA_UNROLL
      for (int t = 0; t < kSc; ++t) sc[r][t] = 0.0f;
    }
    for (int x = 0; x < d; ++x) {
      float a[kR], bk[kSc];
      MCC_FA_UNROLL
      for (int r = 0; r < kR; ++r) a[r] = qs[(rg * kR + r) * kLd + x];
      MCC_FA_UNROLL
      for (int t = 0; t < kSc; ++t) bk[t] = ks[(cg + kGroup * t) * kLd + x];
      MCC_FA_UNROLL
      for (int r = 0; r < kR; ++r) {
        MCC_FA_UNROLL
        for (int t = 0; t < kSc; ++t) sc[r][t] = fmaf(a[r], bk[t], sc[r][t]);
      }
    }
    MCC_FA_UNROLL
    for (int r = 0; r < kR; ++r) {
      const int64_t row = i0 + rg * kR + r;
      float mx = -INFINITY;
      MCC_FA_UNROLL
      for (int t = 0; t < kSc; ++t) {
        if (!Visible(p, bi, row, j0 + cg + kGroup * t)) sc[r][t] = -INFINITY;
        mx = fmaxf(mx, sc[r][t]);
      }
      const float mnew = fmaxf(m[r], GroupMax(mx));
      // A row that has seen no key yet keeps m = -inf; subtracting 0 then
      // gives exp(-inf) = 0 instead of NaN.
      const float sub = mnew == -INFINITY ? 0.0f : mnew;
      const float alpha = expf(m[r] - sub);
      float sum = 0.0f;
      MCC_FA_UNROLL
      for (int t = 0; t < kSc; ++t) {
        const int64_t col = j0 + cg + kGroup * t;
        float pv = expf(sc[r][t] - sub);
        sum += pv;
        // The normaliser counts every probability; only the values that
        // reach the output are dropped (as the CPU kernel).
        if (p.dropout && Visible(p, bi, row, col)) {
          pv *= DropFactor(p, bi, h, row, col);
        }
        ps[(rg * kR + r) * kLdp + cg + kGroup * t] = pv;
      }
      l[r] = l[r] * alpha + GroupSum(sum);
      m[r] = mnew;
      MCC_FA_UNROLL
      for (int c = 0; c < kOc; ++c) o[r][c] *= alpha;
    }
    __syncthreads();
    const int nj = kend - j0 < kBc ? static_cast<int>(kend - j0) : kBc;
    for (int j = 0; j < nj; ++j) {
      float pv[kR];
      MCC_FA_UNROLL
      for (int r = 0; r < kR; ++r) pv[r] = ps[(rg * kR + r) * kLdp + j];
      MCC_FA_UNROLL
      for (int c = 0; c < kOc; ++c) {
        const float vv = vs[j * kLd + cg + kGroup * c];
        MCC_FA_UNROLL
        for (int r = 0; r < kR; ++r) o[r][c] = fmaf(pv[r], vv, o[r][c]);
      }
    }
  }
  MCC_FA_UNROLL
  for (int r = 0; r < kR; ++r) {
    const int64_t row = i0 + rg * kR + r;
    if (row >= p.s) continue;
    // A row that saw no key (first_key only): out 0 and lse -inf.
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    MCC_FA_UNROLL
    for (int c = 0; c < kOc; ++c) {
      const int x = cg + kGroup * c;
      if (x < d) {
        internal::StoreAs(p.out, p.ot, q_base + row * q_stride + x,
                          o[r][c] * inv);
      }
    }
    if (cg == 0) {
      p.lse[(bi * p.hq + h) * p.s + row] =
          l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
    }
  }
}

// ---- Backward ---------------------------------------------------------------

// D[b, h, i] = sum_x dout[b, i, h, x] * out[b, i, h, x], one warp per row
// (rows taken in memory order, (b, i, h)); blocks of kThreads threads.
__global__ void __launch_bounds__(kThreads) RowDotKernel(Params p) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t{gridDim.x} * (kThreads / 32);
  const int64_t rows = p.b * p.s * p.hq;
  for (int64_t row = blockIdx.x * int64_t{kThreads / 32} + threadIdx.x / 32;
       row < rows; row += warps) {
    float acc = 0.0f;
    for (int64_t x = lane; x < p.d; x += 32) {
      const int64_t e = row * p.d + x;
      acc = fmaf(internal::LoadAs(p.dout, p.ot, e),
                 internal::LoadAs(p.out, p.ot, e), acc);
    }
    for (int o = 16; o > 0; o >>= 1)
      acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) {
      const int64_t h = row % p.hq, i = (row / p.hq) % p.s,
                    bi = row / (p.hq * p.s);
      p.drow[(bi * p.hq + h) * p.s + i] = acc;
    }
  }
}

// P and dS of probability (bi, h, i, j) from the score st = (scale q) . k,
// dp = dout . v and the row's lse and D: with dropout (factor f = 0 or
// keep_scale), O = (P f) V, so dV takes P f and dP = (dO V^T) f, and D =
// rowsum(dO * O) still equals rowsum(P * dP).
__device__ __forceinline__ void ProbAndGrad(const Params& p, int64_t bi,
                                            int64_t h, int64_t i, int64_t j,
                                            float st, float dp, float lse,
                                            float drow, float* prob,
                                            float* ds) {
  if (!Visible(p, bi, i, j)) {
    *prob = 0.0f;
    *ds = 0.0f;
    return;
  }
  const float pv = expf(st - lse);
  if (p.dropout) {
    const float f = DropFactor(p, bi, h, i, j);
    *ds = pv * (dp * f - drow);
    *prob = pv * f;
  } else {
    *ds = pv * (dp - drow);
    *prob = pv;
  }
}

template <int kD>
__global__ void __launch_bounds__(kThreads) KvGradKernel(Params p) {
  using S = Shapes<kD>;
  constexpr int kBc = S::kKvBc, kBr = S::kKvBr, kR = S::kKvR;
  static_assert(kBc / kR * kGroup == kThreads, "tile and threads disagree");
  constexpr int kLd = kD + 1, kLdt = kBr + 1;
  constexpr int kQc = kBr / kGroup;  // query columns per thread
  constexpr int kOc = kD / kGroup;
  float* ks = SharedFloats();
  float* vs = ks + kBc * kLd;
  float* qs = vs + kBc * kLd;
  float* dos = qs + kBr * kLd;
  float* pt = dos + kBr * kLd;   // P^T (dropped), [kBc, kBr + 1]
  float* dst = pt + kBc * kLdt;  // dS^T
  float* lse_s = dst + kBc * kLdt;
  float* d_s = lse_s + kBr;
  const int tid = threadIdx.x, rg = tid / kGroup, cg = tid % kGroup;
  const int64_t j0 = blockIdx.x * int64_t{kBc};
  const int64_t kvh = blockIdx.y, bi = blockIdx.z;
  const int64_t group = p.hq / p.hkv;
  const int d = static_cast<int>(p.d);
  const int64_t q_stride = p.hq * p.d, kv_stride = p.hkv * p.d;
  const int64_t kv_base = bi * p.s * kv_stride + kvh * p.d;
  LoadTile<kBc, kD>(ks, p.k, p.qt, j0, p.s, kv_base, kv_stride, d, 1.0f);
  LoadTile<kBc, kD>(vs, p.v, p.qt, j0, p.s, kv_base, kv_stride, d, 1.0f);
  float dk[kR][kOc], dv[kR][kOc];
  MCC_FA_UNROLL
  for (int r = 0; r < kR; ++r) {
    MCC_FA_UNROLL
    for (int c = 0; c < kOc; ++c) dk[r][c] = dv[r][c] = 0.0f;
  }
  // Causal: query tiles that end before j0 see none of these keys.
  const int64_t istart = p.causal ? j0 / kBr * kBr : 0;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const int64_t q_base = bi * p.s * q_stride + h * p.d;
    const int64_t row_base = (bi * p.hq + h) * p.s;
    for (int64_t i0 = istart; i0 < p.s; i0 += kBr) {
      // Every query of the tile starts after these keys: nothing to add.
      if (FirstKeyOfTile(p, bi, i0, kBr) >= j0 + kBc) continue;
      __syncthreads();  // The previous tiles are read.
      LoadTile<kBr, kD>(qs, p.q, p.qt, i0, p.s, q_base, q_stride, d, p.scale);
      LoadTile<kBr, kD>(dos, p.dout, p.ot, i0, p.s, q_base, q_stride, d, 1.0f);
      LoadRowTerms<kBr>(lse_s, d_s, p, row_base, i0);
      __syncthreads();
      float st[kR][kQc], dpt[kR][kQc];
      MCC_FA_UNROLL
      for (int r = 0; r < kR; ++r) {
        MCC_FA_UNROLL
        for (int t = 0; t < kQc; ++t) st[r][t] = dpt[r][t] = 0.0f;
      }
      for (int x = 0; x < d; ++x) {
        float kk[kR], vv[kR], qq[kQc], gg[kQc];
        MCC_FA_UNROLL
        for (int r = 0; r < kR; ++r) {
          kk[r] = ks[(rg * kR + r) * kLd + x];
          vv[r] = vs[(rg * kR + r) * kLd + x];
        }
        MCC_FA_UNROLL
        for (int t = 0; t < kQc; ++t) {
          qq[t] = qs[(cg + kGroup * t) * kLd + x];
          gg[t] = dos[(cg + kGroup * t) * kLd + x];
        }
        MCC_FA_UNROLL
        for (int r = 0; r < kR; ++r) {
          MCC_FA_UNROLL
          for (int t = 0; t < kQc; ++t) {
            st[r][t] = fmaf(kk[r], qq[t], st[r][t]);
            dpt[r][t] = fmaf(vv[r], gg[t], dpt[r][t]);
          }
        }
      }
      MCC_FA_UNROLL
      for (int r = 0; r < kR; ++r) {
        MCC_FA_UNROLL
        for (int t = 0; t < kQc; ++t) {
          const int it = cg + kGroup * t;
          float prob, ds;
          ProbAndGrad(p, bi, h, i0 + it, j0 + rg * kR + r, st[r][t], dpt[r][t],
                      lse_s[it], d_s[it], &prob, &ds);
          pt[(rg * kR + r) * kLdt + it] = prob;
          dst[(rg * kR + r) * kLdt + it] = ds;
        }
      }
      __syncthreads();
      const int ni = p.s - i0 < kBr ? static_cast<int>(p.s - i0) : kBr;
      for (int it = 0; it < ni; ++it) {
        float a[kR], g[kR];
        MCC_FA_UNROLL
        for (int r = 0; r < kR; ++r) {
          a[r] = pt[(rg * kR + r) * kLdt + it];
          g[r] = dst[(rg * kR + r) * kLdt + it];
        }
        MCC_FA_UNROLL
        for (int c = 0; c < kOc; ++c) {
          const float go = dos[it * kLd + cg + kGroup * c];
          const float qv = qs[it * kLd + cg + kGroup * c];
          MCC_FA_UNROLL
          for (int r = 0; r < kR; ++r) {
            dv[r][c] = fmaf(a[r], go, dv[r][c]);
            dk[r][c] = fmaf(g[r], qv, dk[r][c]);
          }
        }
      }
    }
  }
  MCC_FA_UNROLL
  for (int r = 0; r < kR; ++r) {
    const int64_t j = j0 + rg * kR + r;
    if (j >= p.s) continue;
    MCC_FA_UNROLL
    for (int c = 0; c < kOc; ++c) {
      const int x = cg + kGroup * c;
      if (x < d) {
        internal::StoreAs(p.dk, p.dkt, kv_base + j * kv_stride + x, dk[r][c]);
        internal::StoreAs(p.dv, p.dkt, kv_base + j * kv_stride + x, dv[r][c]);
      }
    }
  }
}

template <int kD>
__global__ void __launch_bounds__(kThreads) QGradKernel(Params p) {
  using S = Shapes<kD>;
  constexpr int kBr = S::kQBr, kBc = S::kQBc, kR = S::kQR;
  static_assert(kBr / kR * kGroup == kThreads, "tile and threads disagree");
  constexpr int kLd = kD + 1, kLdp = kBc + 1;
  constexpr int kSc = kBc / kGroup;
  constexpr int kOc = kD / kGroup;
  float* qs = SharedFloats();
  float* dos = qs + kBr * kLd;
  float* ks = dos + kBr * kLd;
  float* vs = ks + kBc * kLd;
  float* dss = vs + kBc * kLd;  // dS, [kBr, kBc + 1]
  float* lse_s = dss + kBr * kLdp;
  float* d_s = lse_s + kBr;
  const int tid = threadIdx.x, rg = tid / kGroup, cg = tid % kGroup;
  const int64_t i0 = (gridDim.x - 1 - blockIdx.x) * int64_t{kBr};
  const int64_t h = blockIdx.y, bi = blockIdx.z;
  const int64_t kvh = h / (p.hq / p.hkv);
  const int d = static_cast<int>(p.d);
  const int64_t q_stride = p.hq * p.d, kv_stride = p.hkv * p.d;
  const int64_t q_base = bi * p.s * q_stride + h * p.d;
  const int64_t kv_base = bi * p.s * kv_stride + kvh * p.d;
  LoadTile<kBr, kD>(qs, p.q, p.qt, i0, p.s, q_base, q_stride, d, p.scale);
  LoadTile<kBr, kD>(dos, p.dout, p.ot, i0, p.s, q_base, q_stride, d, 1.0f);
  LoadRowTerms<kBr>(lse_s, d_s, p, (bi * p.hq + h) * p.s, i0);
  float dq[kR][kOc];
  MCC_FA_UNROLL
  for (int r = 0; r < kR; ++r) {
    MCC_FA_UNROLL
    for (int c = 0; c < kOc; ++c) dq[r][c] = 0.0f;
  }
  const int64_t kend = p.causal && i0 + kBr < p.s ? i0 + kBr : p.s;
  const int64_t kbegin = FirstKeyOfTile(p, bi, i0, kBr) / kBc * kBc;
  for (int64_t j0 = kbegin; j0 < kend; j0 += kBc) {
    __syncthreads();
    LoadTile<kBc, kD>(ks, p.k, p.qt, j0, p.s, kv_base, kv_stride, d, 1.0f);
    LoadTile<kBc, kD>(vs, p.v, p.qt, j0, p.s, kv_base, kv_stride, d, 1.0f);
    __syncthreads();
    float sc[kR][kSc], dp[kR][kSc];
    MCC_FA_UNROLL
    for (int r = 0; r < kR; ++r) {
      MCC_FA_UNROLL
      for (int t = 0; t < kSc; ++t) sc[r][t] = dp[r][t] = 0.0f;
    }
    for (int x = 0; x < d; ++x) {
      float qq[kR], gg[kR], kk[kSc], vv[kSc];
      MCC_FA_UNROLL
      for (int r = 0; r < kR; ++r) {
        qq[r] = qs[(rg * kR + r) * kLd + x];
        gg[r] = dos[(rg * kR + r) * kLd + x];
      }
      MCC_FA_UNROLL
      for (int t = 0; t < kSc; ++t) {
        kk[t] = ks[(cg + kGroup * t) * kLd + x];
        vv[t] = vs[(cg + kGroup * t) * kLd + x];
      }
      MCC_FA_UNROLL
      for (int r = 0; r < kR; ++r) {
        MCC_FA_UNROLL
        for (int t = 0; t < kSc; ++t) {
          sc[r][t] = fmaf(qq[r], kk[t], sc[r][t]);
          dp[r][t] = fmaf(gg[r], vv[t], dp[r][t]);
        }
      }
    }
    MCC_FA_UNROLL
    for (int r = 0; r < kR; ++r) {
      const int ir = rg * kR + r;
      MCC_FA_UNROLL
      for (int t = 0; t < kSc; ++t) {
        float prob, ds;
        ProbAndGrad(p, bi, h, i0 + ir, j0 + cg + kGroup * t, sc[r][t], dp[r][t],
                    lse_s[ir], d_s[ir], &prob, &ds);
        dss[ir * kLdp + cg + kGroup * t] = ds;
      }
    }
    __syncthreads();
    const int nj = kend - j0 < kBc ? static_cast<int>(kend - j0) : kBc;
    for (int j = 0; j < nj; ++j) {
      float g[kR];
      MCC_FA_UNROLL
      for (int r = 0; r < kR; ++r) g[r] = dss[(rg * kR + r) * kLdp + j];
      MCC_FA_UNROLL
      for (int c = 0; c < kOc; ++c) {
        const float kv = ks[j * kLd + cg + kGroup * c];
        MCC_FA_UNROLL
        for (int r = 0; r < kR; ++r) dq[r][c] = fmaf(g[r], kv, dq[r][c]);
      }
    }
  }
  MCC_FA_UNROLL
  for (int r = 0; r < kR; ++r) {
    const int64_t row = i0 + rg * kR + r;
    if (row >= p.s) continue;
    MCC_FA_UNROLL
    for (int c = 0; c < kOc; ++c) {
      const int x = cg + kGroup * c;
      if (x < d) {
        internal::StoreAs(p.dq, p.dqt, q_base + row * q_stride + x,
                          dq[r][c] * p.scale);
      }
    }
  }
}

}  // namespace flash
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FLASH_ATTENTION_KERNELS_CUH_
