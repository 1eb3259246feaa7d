// Device code of the tensor-core flash-attention backward (FlashAttention-2
// recomputation; every product a warp-level mma.m16n8k16 with bf16 or fp16
// operands and fp32 accumulators, mma_tile.cuh), for head dims 64 and 128
// with 16-bit q, k and v on sm_80+. flash_attention.cu launches it
// (FlashAttentionBackward picks it); flash_attention_mma_backward_emulated_
// test.cc runs it on the host emulator. Same contract and split as the SIMT
// backward (flash_attention_kernels.cuh: RowDotKernel computes D first):
//   MmaKvGradKernel: one block per (64-key tile, kv head, batch entry):
//     over the query heads of the group and their 64-row query tiles,
//     recomputes S^T = K Q^T and dP^T = V dO^T, then P^T and dS^T from lse
//     and D, and accumulates dV += P^T dO and dK += dS^T Q in registers;
//   MmaQGradKernel: one block per (64-row query tile, head, batch entry):
//     over the key tiles, S = Q K^T and dP = dO V^T, dS, dQ += dS K.
// Two kernels rather than one with atomic dQ adds: no atomics, so results
// are the same run to run, as the SIMT backward's. Causal, GQA, first_key
// (key tiles before a query tile's first key skipped in both kernels),
// dropout from the same Philox words (ProbAndGrad), ragged last tiles (rows
// past s load as zero and are masked).
//
// Arithmetic: products of 16-bit values exact in fp32, sums in fp32 (the
// tensor cores' truncating adds); the score is scaled after the product;
// P (dropped) and dS are rounded to q's 16-bit type before their products
// (the roundings the SIMT kernel does not make), and so is dO when its type
// is not q's; dK and dQ take the scale after their sums.
//
// Threads: 4 warps; in MmaKvGradKernel warp w owns keys 16 w .. + 15 of the
// key tile (rows of S^T), in MmaQGradKernel query rows 16 w .. + 15, and
// each lane (g = lane / 4, t = lane % 4) rows g and g + 8 of those as the
// C fragments lay them out. A [16 x 16] pair of C fragments of one 16-wide
// step is an A fragment, so P and dS go from accumulators to operands in
// registers. Tiles sit in shared memory as 16-bit bits with rows of kD + 8
// (MmaSmem).
#ifndef CORE_OPS_CUDA_FLASH_ATTENTION_MMA_BACKWARD_KERNELS_CUH_
#define CORE_OPS_CUDA_FLASH_ATTENTION_MMA_BACKWARD_KERNELS_CUH_

#include <cstdint>

#include "core/ops/cuda/flash_attention_kernels.cuh"
#include "core/ops/cuda/flash_attention_mma_kernels.cuh"
#include "core/ops/cuda/mma_tile.cuh"

namespace mcc {
namespace cuda_kernels {
namespace flash {

// Bytes of dynamic shared memory of the backward kernels: K, V, Q and dO
// tiles of 64 rows, and (MmaKvGradKernel) lse and D of the query tile.
template <int kD>
struct MmaBackwardSmem {
  static constexpr size_t kTiles =
      static_cast<size_t>(2 * kMmaBr + 2 * kMmaBc) * MmaSmem<kD>::kLd *
      sizeof(uint16_t);
  static constexpr size_t kKvGrad = kTiles + 2 * kMmaBr * sizeof(float);
  static constexpr size_t kQGrad = kTiles;
};

template <int kD>
Grid MmaKvGradGrid(const Params& p) {
  const int64_t tiles = (p.s + kMmaBc - 1) / kMmaBc;
  return {static_cast<unsigned int>(tiles), static_cast<unsigned int>(p.hkv),
          static_cast<unsigned int>(p.b)};
}

template <int kD>
Grid MmaQGradGrid(const Params& p) {
  return MmaForwardGrid<kD>(p);
}

__host__ __device__ constexpr ElemType ElemTypeOfInput(mma::Input in) {
  return in == mma::Input::kBF16 ? ElemType::kBF16 : ElemType::kF16;
}

// dO's rows row0 .. + kRows - 1 of one head as kIn bits (LoadBitsTile):
// copied when dout is already kIn (the launcher checked its alignment),
// else rounded from its type element by element.
template <int kRows, int kD, mma::Input kIn>
__device__ __forceinline__ void LoadDoutTile(uint16_t* dst, const Params& p,
                                             int64_t row0, int64_t base,
                                             int64_t stride) {
  if (p.ot == ElemTypeOfInput(kIn)) {
    LoadBitsTile<kRows, kD>(dst, p.dout, row0, p.s, base, stride);
    return;
  }
  for (int e = threadIdx.x; e < kRows * kD; e += kMmaThreads) {
    const int r = e / kD, x = e % kD;
    dst[r * MmaSmem<kD>::kLd + x] =
        row0 + r < p.s ? ToBits<kIn>(internal::LoadAs(
                             p.dout, p.ot, base + (row0 + r) * stride + x))
                       : uint16_t{0};
  }
}

// The A fragment of rows `row` (g) and row + 8 of a row-major 16-bit tile
// with rows of kLd elements, k columns 16 kk .. 16 kk + 15.
template <int kLd>
__device__ __forceinline__ void LoadA(uint32_t a[4], const uint16_t* tile,
                                      int row, int kk, int t) {
  const uint16_t* at = tile + row * kLd + 16 * kk + 2 * t;
  a[0] = Word(at);
  a[1] = Word(at + 8 * kLd);
  a[2] = Word(at + 8);
  a[3] = Word(at + 8 * kLd + 8);
}

// The B fragment of B[k][n] = tile[n0 + n][16 kk + k] (the tile's rows are
// B's columns: S = Q K^T reads K so).
template <int kLd>
__device__ __forceinline__ void LoadBRows(uint32_t b[2], const uint16_t* tile,
                                          int n0, int kk, int g, int t) {
  const uint16_t* at = tile + (n0 + g) * kLd + 16 * kk + 2 * t;
  b[0] = Word(at);
  b[1] = Word(at + 8);
}

// The B fragment of B[k][n] = tile[16 kk + k][n0 + n] (the tile's rows are
// B's k: O += P V reads V so), two 16-bit loads a register.
template <int kLd>
__device__ __forceinline__ void LoadBCols(uint32_t b[2], const uint16_t* tile,
                                          int n0, int kk, int g, int t) {
  const uint16_t* at = tile + (16 * kk + 2 * t) * kLd + n0 + g;
  b[0] = mma::Pack(at[0], at[kLd]);
  b[1] = mma::Pack(at[8 * kLd], at[9 * kLd]);
}

template <int kD, mma::Input kIn>
__global__ void __launch_bounds__(kMmaThreads) MmaKvGradKernel(Params p) {
  static_assert(
      kD % 16 == 0 && kMmaBc == 16 * (kMmaThreads / 32) && kMmaBr % 16 == 0,
      "tile and warps disagree");
  constexpr int kLd = MmaSmem<kD>::kLd;
  constexpr int kKSteps = kD / 16;      // k steps of S^T and dP^T
  constexpr int kQTiles = kMmaBr / 8;   // n tiles of S^T (8 queries each)
  constexpr int kDTiles = kD / 8;       // n tiles of dK and dV (8 dims each)
  constexpr int kPSteps = kMmaBr / 16;  // k steps of dV and dK (16 queries)
  uint16_t* ks = reinterpret_cast<uint16_t*>(SharedFloats());
  uint16_t* vs = ks + kMmaBc * kLd;
  uint16_t* qs = vs + kMmaBc * kLd;
  uint16_t* dos = qs + kMmaBr * kLd;
  float* lse_s = reinterpret_cast<float*>(dos + kMmaBr * kLd);
  float* d_s = lse_s + kMmaBr;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t j0 = blockIdx.x * int64_t{kMmaBc};
  const int64_t kvh = blockIdx.y, bi = blockIdx.z;
  const int64_t group = p.hq / p.hkv;
  const int64_t q_stride = p.hq * kD, kv_stride = p.hkv * kD;
  const int64_t kv_base = bi * p.s * kv_stride + kvh * kD;
  LoadBitsTile<kMmaBc, kD>(ks, p.k, j0, p.s, kv_base, kv_stride);
  LoadBitsTile<kMmaBc, kD>(vs, p.v, j0, p.s, kv_base, kv_stride);

  // This lane's keys: rows g (r = 0) and g + 8 of the warp's 16.
  const int wk = 16 * warp + g;
  const int64_t key[2] = {j0 + wk, j0 + wk + 8};
  float dk[kDTiles][4], dv[kDTiles][4];
  MCC_FA_UNROLL
  for (int n = 0; n < kDTiles; ++n) {
    MCC_FA_UNROLL
    for (int i = 0; i < 4; ++i) dk[n][i] = dv[n][i] = 0.0f;
  }
  // Causal: query tiles that end before j0 see none of these keys.
  const int64_t istart = p.causal ? j0 / kMmaBr * kMmaBr : 0;
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    const int64_t q_base = bi * p.s * q_stride + h * kD;
    const int64_t row_base = (bi * p.hq + h) * p.s;
    for (int64_t i0 = istart; i0 < p.s; i0 += kMmaBr) {
      // Every query of the tile starts after these keys: nothing to add.
      if (FirstKeyOfTile(p, bi, i0, kMmaBr) >= j0 + kMmaBc) continue;
      __syncthreads();  // The previous query tile is read.
      LoadBitsTile<kMmaBr, kD>(qs, p.q, i0, p.s, q_base, q_stride);
      LoadDoutTile<kMmaBr, kD, kIn>(dos, p, i0, q_base, q_stride);
      LoadRowTerms<kMmaBr>(lse_s, d_s, p, row_base, i0);
      __syncthreads();
      // S^T = K Q^T and dP^T = V dO^T: rows keys, columns queries.
      float st[kQTiles][4], dpt[kQTiles][4];
      MCC_FA_UNROLL
      for (int n = 0; n < kQTiles; ++n) {
        MCC_FA_UNROLL
        for (int i = 0; i < 4; ++i) st[n][i] = dpt[n][i] = 0.0f;
      }
      MCC_FA_UNROLL
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t ak[4], av[4];
        LoadA<kLd>(ak, ks, wk, kk, t);
        LoadA<kLd>(av, vs, wk, kk, t);
        MCC_FA_UNROLL
        for (int n = 0; n < kQTiles; ++n) {
          uint32_t b[2];
          LoadBRows<kLd>(b, qs, 8 * n, kk, g, t);
          mma::MmaM16N8K16<kIn>(st[n], ak, b);
          LoadBRows<kLd>(b, dos, 8 * n, kk, g, t);
          mma::MmaM16N8K16<kIn>(dpt[n], av, b);
        }
      }
      // P^T (dropped) and dS^T as 16-bit pairs [n][r] of keys key[r].
      uint32_t pf[kQTiles][2], sf[kQTiles][2];
      MCC_FA_UNROLL
      for (int n = 0; n < kQTiles; ++n) {
        MCC_FA_UNROLL
        for (int r = 0; r < 2; ++r) {
          uint16_t pb[2], sb[2];
          MCC_FA_UNROLL
          for (int c = 0; c < 2; ++c) {
            const int it = 8 * n + 2 * t + c;
            float prob, ds;
            ProbAndGrad(p, bi, h, i0 + it, key[r], st[n][2 * r + c] * p.scale,
                        dpt[n][2 * r + c], lse_s[it], d_s[it], &prob, &ds);
            pb[c] = ToBits<kIn>(prob);
            sb[c] = ToBits<kIn>(ds);
          }
          pf[n][r] = mma::Pack(pb[0], pb[1]);
          sf[n][r] = mma::Pack(sb[0], sb[1]);
        }
      }
      // dV += P^T dO and dK += dS^T Q: A = queries 16 kk .. + 15 (tiles 2 kk
      // and 2 kk + 1), B[k][n] = dO or Q[query k][dim n].
      MCC_FA_UNROLL
      for (int kk = 0; kk < kPSteps; ++kk) {
        const uint32_t ap[4] = {pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0],
                                pf[2 * kk + 1][1]};
        const uint32_t as[4] = {sf[2 * kk][0], sf[2 * kk][1], sf[2 * kk + 1][0],
                                sf[2 * kk + 1][1]};
        MCC_FA_UNROLL
        for (int n = 0; n < kDTiles; ++n) {
          uint32_t b[2];
          LoadBCols<kLd>(b, dos, 8 * n, kk, g, t);
          mma::MmaM16N8K16<kIn>(dv[n], ap, b);
          LoadBCols<kLd>(b, qs, 8 * n, kk, g, t);
          mma::MmaM16N8K16<kIn>(dk[n], as, b);
        }
      }
    }
  }
  MCC_FA_UNROLL
  for (int r = 0; r < 2; ++r) {
    if (key[r] >= p.s) continue;
    MCC_FA_UNROLL
    for (int n = 0; n < kDTiles; ++n) {
      MCC_FA_UNROLL
      for (int c = 0; c < 2; ++c) {
        const int64_t e = kv_base + key[r] * kv_stride + 8 * n + 2 * t + c;
        internal::StoreAs(p.dk, p.dkt, e, dk[n][2 * r + c] * p.scale);
        internal::StoreAs(p.dv, p.dkt, e, dv[n][2 * r + c]);
      }
    }
  }
}

template <int kD, mma::Input kIn>
__global__ void __launch_bounds__(kMmaThreads) MmaQGradKernel(Params p) {
  static_assert(
      kD % 16 == 0 && kMmaBr == 16 * (kMmaThreads / 32) && kMmaBc % 16 == 0,
      "tile and warps disagree");
  constexpr int kLd = MmaSmem<kD>::kLd;
  constexpr int kKSteps = kD / 16;      // k steps of S and dP
  constexpr int kSTiles = kMmaBc / 8;   // n tiles of S (8 keys each)
  constexpr int kDTiles = kD / 8;       // n tiles of dQ
  constexpr int kPSteps = kMmaBc / 16;  // k steps of dQ += dS K
  uint16_t* qs = reinterpret_cast<uint16_t*>(SharedFloats());
  uint16_t* dos = qs + kMmaBr * kLd;
  uint16_t* ks = dos + kMmaBr * kLd;
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
  LoadDoutTile<kMmaBr, kD, kIn>(dos, p, i0, q_base, q_stride);

  // This lane's rows (0: g, 1: g + 8 of the warp's 16), their lse and D.
  const int wr = 16 * warp + g;
  int64_t row[2];
  float lse[2], drow[2];
  for (int r = 0; r < 2; ++r) {
    row[r] = i0 + wr + 8 * r;
    const int64_t at = (bi * p.hq + h) * p.s + row[r];
    lse[r] = row[r] < p.s ? p.lse[at] : 0.0f;
    drow[r] = row[r] < p.s ? p.drow[at] : 0.0f;
  }
  float dq[kDTiles][4];
  MCC_FA_UNROLL
  for (int n = 0; n < kDTiles; ++n) {
    MCC_FA_UNROLL
    for (int i = 0; i < 4; ++i) dq[n][i] = 0.0f;
  }
  const int64_t kend = p.causal && i0 + kMmaBr < p.s ? i0 + kMmaBr : p.s;
  const int64_t kbegin = FirstKeyOfTile(p, bi, i0, kMmaBr) / kMmaBc * kMmaBc;
  for (int64_t j0 = kbegin; j0 < kend; j0 += kMmaBc) {
    __syncthreads();  // The previous tile's K and V are read (and Q, dO
                      // written, the first time).
    LoadBitsTile<kMmaBc, kD>(ks, p.k, j0, p.s, kv_base, kv_stride);
    LoadBitsTile<kMmaBc, kD>(vs, p.v, j0, p.s, kv_base, kv_stride);
    __syncthreads();
    // S = Q K^T and dP = dO V^T: rows queries, columns keys.
    float sc[kSTiles][4], dp[kSTiles][4];
    MCC_FA_UNROLL
    for (int n = 0; n < kSTiles; ++n) {
      MCC_FA_UNROLL
      for (int i = 0; i < 4; ++i) sc[n][i] = dp[n][i] = 0.0f;
    }
    MCC_FA_UNROLL
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t aq[4], ao[4];
      LoadA<kLd>(aq, qs, wr, kk, t);
      LoadA<kLd>(ao, dos, wr, kk, t);
      MCC_FA_UNROLL
      for (int n = 0; n < kSTiles; ++n) {
        uint32_t b[2];
        LoadBRows<kLd>(b, ks, 8 * n, kk, g, t);
        mma::MmaM16N8K16<kIn>(sc[n], aq, b);
        LoadBRows<kLd>(b, vs, 8 * n, kk, g, t);
        mma::MmaM16N8K16<kIn>(dp[n], ao, b);
      }
    }
    // dS as 16-bit pairs [n][r].
    uint32_t sf[kSTiles][2];
    MCC_FA_UNROLL
    for (int n = 0; n < kSTiles; ++n) {
      MCC_FA_UNROLL
      for (int r = 0; r < 2; ++r) {
        uint16_t sb[2];
        MCC_FA_UNROLL
        for (int c = 0; c < 2; ++c) {
          float prob, ds;
          ProbAndGrad(p, bi, h, row[r], j0 + 8 * n + 2 * t + c,
                      sc[n][2 * r + c] * p.scale, dp[n][2 * r + c], lse[r],
                      drow[r], &prob, &ds);
          sb[c] = ToBits<kIn>(ds);
        }
        sf[n][r] = mma::Pack(sb[0], sb[1]);
      }
    }
    // dQ += dS K: A = keys 16 kk .. + 15, B[k][n] = K[key k][dim n].
    MCC_FA_UNROLL
    for (int kk = 0; kk < kPSteps; ++kk) {
      const uint32_t a[4] = {sf[2 * kk][0], sf[2 * kk][1], sf[2 * kk + 1][0],
                             sf[2 * kk + 1][1]};
      MCC_FA_UNROLL
      for (int n = 0; n < kDTiles; ++n) {
        uint32_t b[2];
        LoadBCols<kLd>(b, ks, 8 * n, kk, g, t);
        mma::MmaM16N8K16<kIn>(dq[n], a, b);
      }
    }
  }
  MCC_FA_UNROLL
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= p.s) continue;
    MCC_FA_UNROLL
    for (int n = 0; n < kDTiles; ++n) {
      MCC_FA_UNROLL
      for (int c = 0; c < 2; ++c) {
        internal::StoreAs(p.dq, p.dqt,
                          q_base + row[r] * q_stride + 8 * n + 2 * t + c,
                          dq[n][2 * r + c] * p.scale);
      }
    }
  }
}

}  // namespace flash
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FLASH_ATTENTION_MMA_BACKWARD_KERNELS_CUH_
