// Device code of the tensor-core flash-attention forward (FlashAttention-2
// tiling; S = q k^T and O += P V as warp-level mma.m16n8k16 products with
// bf16 or fp16 operands and fp32 accumulators, mma_tile.cuh), for head dims
// 64 and 128 with 16-bit q, k and v on sm_80+. flash_attention.cu launches
// it (FlashAttentionForward picks it); flash_attention_mma_emulated_test.cc
// runs it on the host emulator. Same contract as ForwardKernel
// (flash_attention_kernels.cuh, whose Params and helpers it uses): causal
// or not, GQA, first_key (key tiles before a tile's first key skipped),
// dropout drawn from the same Philox words, out in p.ot, lse in fp32.
//
// Arithmetic: q, k and v stay 16-bit (products exact in fp32); scores are
// accumulated in fp32 and scaled after the product (the fp32 kernel scales
// q first); softmax in fp32 as ForwardKernel (expf, online max, the
// normaliser l from the fp32 probabilities); P is rounded to q's 16-bit
// type for P V (the one rounding the fp32 kernel does not make); O is
// accumulated in fp32.
//
// Threads: 4 warps; warp w owns query rows 16 w .. 16 w + 15 of a 64-row
// tile, and each lane (g = lane / 4, t = lane % 4) rows g and g + 8 of
// those, as the C fragments lay them out: a row's statistics are reduced
// over the 4 lanes of a quad. The score fragments become P's A fragments
// in registers (C's [16 x 8] pairs of one 16-key step are A's layout).
// Shared memory holds the Q, K and V tiles as 16-bit bits with rows of kD +
// 8 elements (16 bytes of padding: a fragment's 32 lanes read 32 distinct
// banks).
#ifndef CORE_OPS_CUDA_FLASH_ATTENTION_MMA_KERNELS_CUH_
#define CORE_OPS_CUDA_FLASH_ATTENTION_MMA_KERNELS_CUH_

#include <cstdint>
#include <cstring>

#include "core/ops/cuda/flash_attention_kernels.cuh"
#include "core/ops/cuda/mma_tile.cuh"

namespace mcc {
namespace cuda_kernels {
namespace flash {

constexpr int kMmaThreads = 128;
constexpr int kMmaBr = 64;  // query rows per block (16 per warp)
constexpr int kMmaBc = 64;  // keys per step

// Bytes of dynamic shared memory of MmaForwardKernel<kD>.
template <int kD>
struct MmaSmem {
  static constexpr int kLd = kD + 8;  // 16-bit elements per tile row
  static constexpr size_t kForward =
      static_cast<size_t>(kMmaBr + 2 * kMmaBc) * kLd * sizeof(uint16_t);
};

template <int kD>
Grid MmaForwardGrid(const Params& p) {
  const int64_t tiles = (p.s + kMmaBr - 1) / kMmaBr;
  return {static_cast<unsigned int>(tiles), static_cast<unsigned int>(p.hq),
          static_cast<unsigned int>(p.b)};
}

__device__ __forceinline__ void Copy16Bytes(void* dst, const void* src) {
#ifdef __CUDA_ARCH__
  *static_cast<uint4*>(dst) = *static_cast<const uint4*>(src);
#else
  std::memcpy(dst, src, 16);
#endif
}

__device__ __forceinline__ void Zero16Bytes(void* dst) {
#ifdef __CUDA_ARCH__
  *static_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
#else
  std::memset(dst, 0, 16);
#endif
}

// Two adjacent 16-bit elements as one register (p even-aligned).
__device__ __forceinline__ uint32_t Word(const uint16_t* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
#endif
}

// Rows row0 .. row0 + kRows - 1 of one head of a [b, s, heads, kD] 16-bit
// tensor into dst [kRows, kD + 8] in 16-byte pieces; rows past s are zero.
// `base` is the element offset of (b, 0, head, 0), `stride` the elements
// between rows; the launcher has checked 16-byte alignment.
template <int kRows, int kD>
__device__ __forceinline__ void LoadBitsTile(uint16_t* dst, const void* src,
                                             int64_t row0, int64_t s,
                                             int64_t base, int64_t stride) {
  constexpr int kPieces = kD / 8;
  const uint16_t* in = static_cast<const uint16_t*>(src);
  for (int e = threadIdx.x; e < kRows * kPieces; e += kMmaThreads) {
    const int r = e / kPieces, c = e % kPieces;
    uint16_t* to = dst + r * MmaSmem<kD>::kLd + c * 8;
    if (row0 + r < s) {
      Copy16Bytes(to, in + base + (row0 + r) * stride + c * 8);
    } else {
      Zero16Bytes(to);
    }
  }
}

// v rounded to the 16-bit input type, as bits.
template <mma::Input kIn>
__device__ __forceinline__ uint16_t ToBits(float v) {
  uint16_t bits;
  internal::StoreAs(
      &bits, kIn == mma::Input::kBF16 ? ElemType::kBF16 : ElemType::kF16, 0, v);
  return bits;
}

template <int kD, mma::Input kIn>
__global__ void __launch_bounds__(kMmaThreads) MmaForwardKernel(Params p) {
  static_assert(kD % 16 == 0 && kMmaBr == 16 * (kMmaThreads / 32),
                "tile and warps disagree");
  constexpr int kLd = MmaSmem<kD>::kLd;
  constexpr int kKSteps = kD / 16;      // k steps of S = Q K^T
  constexpr int kSTiles = kMmaBc / 8;   // n tiles of S (8 keys each)
  constexpr int kOTiles = kD / 8;       // n tiles of O (8 dims each)
  constexpr int kPSteps = kMmaBc / 16;  // k steps of O += P V
  uint16_t* qs = reinterpret_cast<uint16_t*>(SharedFloats());
  uint16_t* ks = qs + kMmaBr * kLd;
  uint16_t* vs = ks + kMmaBc * kLd;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  // The longest (last, when causal) query tiles first.
  const int64_t i0 = (gridDim.x - 1 - blockIdx.x) * int64_t{kMmaBr};
  const int64_t h = blockIdx.y, bi = blockIdx.z;
  const int64_t kvh = h / (p.hq / p.hkv);
  const int64_t q_stride = p.hq * kD, kv_stride = p.hkv * kD;
  const int64_t q_base = bi * p.s * q_stride + h * kD;
  const int64_t kv_base = bi * p.s * kv_stride + kvh * kD;
  LoadBitsTile<kMmaBr, kD>(qs, p.q, i0, p.s, q_base, q_stride);
  __syncthreads();

  // This lane's rows (0: g, 1: g + 8 of the warp's 16) and their first keys.
  const int wr = 16 * warp + g;
  int64_t row[2], first[2];
  for (int r = 0; r < 2; ++r) {
    row[r] = i0 + wr + 8 * r;
    first[r] = p.first_key != nullptr && row[r] < p.s
                   ? p.first_key[bi * p.s + row[r]]
                   : 0;
  }
  uint32_t qf[kKSteps][4];
  MCC_FA_UNROLL
  for (int kk = 0; kk < kKSteps; ++kk) {
    const uint16_t* at = qs + wr * kLd + 16 * kk + 2 * t;
    qf[kk][0] = Word(at);
    qf[kk][1] = Word(at + 8 * kLd);
    qf[kk][2] = Word(at + 8);
    qf[kk][3] = Word(at + 8 * kLd + 8);
  }

  float o[kOTiles][4], m[2], l[2];
  MCC_FA_UNROLL
  for (int n = 0; n < kOTiles; ++n) {
    MCC_FA_UNROLL
    for (int i = 0; i < 4; ++i) o[n][i] = 0.0f;
  }
  m[0] = m[1] = -INFINITY;
  l[0] = l[1] = 0.0f;
  const int64_t kend = p.causal && i0 + kMmaBr < p.s ? i0 + kMmaBr : p.s;
  const int64_t kbegin = FirstKeyOfTile(p, bi, i0, kMmaBr) / kMmaBc * kMmaBc;
  for (int64_t j0 = kbegin; j0 < kend; j0 += kMmaBc) {
    __syncthreads();  // The previous tile's K and V are read.
    LoadBitsTile<kMmaBc, kD>(ks, p.k, j0, p.s, kv_base, kv_stride);
    LoadBitsTile<kMmaBc, kD>(vs, p.v, j0, p.s, kv_base, kv_stride);
    __syncthreads();
    // S = Q K^T: B[k][n] = K[key n][dim k], so b[0] is two adjacent dims
    // of key g.
    float sc[kSTiles][4];
    MCC_FA_UNROLL
    for (int n = 0; n < kSTiles; ++n) {
      MCC_FA_UNROLL
      for (int i = 0; i < 4; ++i) sc[n][i] = 0.0f;
    }
    MCC_FA_UNROLL
    for (int kk = 0; kk < kKSteps; ++kk) {
      MCC_FA_UNROLL
      for (int n = 0; n < kSTiles; ++n) {
        const uint16_t* at = ks + (8 * n + g) * kLd + 16 * kk + 2 * t;
        const uint32_t b[2] = {Word(at), Word(at + 8)};
        mma::MmaM16N8K16<kIn>(sc[n], qf[kk], b);
      }
    }
    // Scale, mask, and the online softmax of rows g (r = 0) and g + 8.
    uint32_t pf[kSTiles][2];  // P as 16-bit pairs: [n][r]
    MCC_FA_UNROLL
    for (int r = 0; r < 2; ++r) {
      float mx = -INFINITY;
      MCC_FA_UNROLL
      for (int n = 0; n < kSTiles; ++n) {
        MCC_FA_UNROLL
        for (int c = 0; c < 2; ++c) {
          const int64_t col = j0 + 8 * n + 2 * t + c;
          const bool seen = row[r] < p.s && col < p.s &&
                            (!p.causal || col <= row[r]) && col >= first[r];
          float& x = sc[n][2 * r + c];
          x = seen ? x * p.scale : -INFINITY;
          mx = fmaxf(mx, x);
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mnew = fmaxf(m[r], mx);
      // A row that has seen no key yet keeps m = -inf; subtracting 0 then
      // gives exp(-inf) = 0 instead of NaN.
      const float sub = mnew == -INFINITY ? 0.0f : mnew;
      const float alpha = expf(m[r] - sub);
      float sum = 0.0f;
      MCC_FA_UNROLL
      for (int n = 0; n < kSTiles; ++n) {
        uint16_t bits[2];
        MCC_FA_UNROLL
        for (int c = 0; c < 2; ++c) {
          float pv = expf(sc[n][2 * r + c] - sub);
          sum += pv;
          // The normaliser counts every probability; only the values that
          // reach the output are dropped (as the CPU kernel).
          const int64_t col = j0 + 8 * n + 2 * t + c;
          if (p.dropout && pv > 0.0f) {
            pv *= DropFactor(p, bi, h, row[r], col);
          }
          bits[c] = ToBits<kIn>(pv);
        }
        pf[n][r] = mma::Pack(bits[0], bits[1]);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[r] = l[r] * alpha + sum;
      m[r] = mnew;
      MCC_FA_UNROLL
      for (int n = 0; n < kOTiles; ++n) {
        o[n][2 * r] *= alpha;
        o[n][2 * r + 1] *= alpha;
      }
    }
    // O += P V: A = P's keys 16 kk .. + 15 (score tiles 2 kk and 2 kk + 1),
    // B[k][n] = V[key k][dim n], two keys of one dim per register.
    MCC_FA_UNROLL
    for (int kk = 0; kk < kPSteps; ++kk) {
      const uint32_t a[4] = {pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0],
                             pf[2 * kk + 1][1]};
      MCC_FA_UNROLL
      for (int n = 0; n < kOTiles; ++n) {
        const uint16_t* at = vs + (16 * kk + 2 * t) * kLd + 8 * n + g;
        const uint32_t b[2] = {mma::Pack(at[0], at[kLd]),
                               mma::Pack(at[8 * kLd], at[9 * kLd])};
        mma::MmaM16N8K16<kIn>(o[n], a, b);
      }
    }
  }
  MCC_FA_UNROLL
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= p.s) continue;
    // A row that saw no key (first_key only): out 0 and lse -inf.
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    MCC_FA_UNROLL
    for (int n = 0; n < kOTiles; ++n) {
      MCC_FA_UNROLL
      for (int c = 0; c < 2; ++c) {
        internal::StoreAs(p.out, p.ot,
                          q_base + row[r] * q_stride + 8 * n + 2 * t + c,
                          o[n][2 * r + c] * inv);
      }
    }
    if (t == 0) {
      p.lse[(bi * p.hq + h) * p.s + row[r]] =
          l[r] > 0.0f ? m[r] + logf(l[r]) : -INFINITY;
    }
  }
}

}  // namespace flash
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FLASH_ATTENTION_MMA_KERNELS_CUH_
