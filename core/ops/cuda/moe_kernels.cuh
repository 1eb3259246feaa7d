// Device code of the mixture-of-experts CUDA kernels (router, balancing and
// z-losses, expert bias, token sort, permutation), apart from their launchers
// (moe.cu) so that the host emulator (cuda_emulator.h) runs them against the
// CPU kernels in CI. The includer provides moe::SharedFloats() (the block's
// dynamic shared memory, 16-byte aligned), internal::LoadAs / StoreAs
// (kernel_util.cuh) and CUDA's thread indices, __syncthreads, expf, exp and
// log.
//
// Determinism: no atomics anywhere. Every output element is written by one
// thread that computes it in a fixed order, and every sum over threads is
// combined in thread order, so a call repeats its bits on every run. Each
// per-token kernel follows its CPU kernel's (core/ops/moe_router.cc,
// moe_permute.cc) order of operations; products and sums that the CPU rounds
// separately go through MulRn / AddRn so nvcc does not fuse them.
#ifndef CORE_OPS_CUDA_MOE_KERNELS_CUH_
#define CORE_OPS_CUDA_MOE_KERNELS_CUH_

#include <cmath>
#include <cstdint>

#include "core/ops/cuda/elem_type.h"

namespace mcc {
namespace cuda_kernels {
namespace moe {

#ifdef __CUDACC__
__device__ __forceinline__ float MulRn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ float AddRn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double DMulRn(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ double DAddRn(double a, double b) {
  return __dadd_rn(a, b);
}
#else
inline float MulRn(float a, float b) { return a * b; }
inline float AddRn(float a, float b) { return a + b; }
inline double DMulRn(double a, double b) { return a * b; }
inline double DAddRn(double a, double b) { return a + b; }
#endif

// Threads per block of the block-wide kernels (sort, sums).
constexpr int kBlockThreads = 256;

__device__ __forceinline__ int64_t ThreadIndex() {
  return blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ int64_t Stride() {
  return int64_t{gridDim.x} * blockDim.x;
}

struct RouterParams {
  const float* logits = nullptr;    // [tokens, experts]
  const float* bias = nullptr;      // [experts] or null
  float* scores = nullptr;          // [tokens, experts]
  int32_t* indices = nullptr;       // [tokens, topk]
  float* weights = nullptr;         // [tokens, topk]
  const float* dweights = nullptr;  // backward: [tokens, topk]
  float* dlogits = nullptr;         // backward: [tokens, experts]
  int64_t tokens = 0, experts = 0, topk = 0;
  bool sigmoid = false, normalize = true;
  float scaling = 1.0f;
};

// One token's scores, as ScoreRow.
__device__ __forceinline__ void ScoreRow(const float* l, int64_t e,
                                         bool sigmoid, float* s) {
  if (sigmoid) {
    for (int64_t j = 0; j < e; ++j) s[j] = 1.0f / (1.0f + expf(-l[j]));
    return;
  }
  float mx = l[0];
  // std::max's order: a NaN first element stays.
  for (int64_t j = 1; j < e; ++j) mx = mx < l[j] ? l[j] : mx;
  float sum = 0.0f;
  for (int64_t j = 0; j < e; ++j) {
    s[j] = expf(l[j] - mx);
    sum = AddRn(sum, s[j]);
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < e; ++j) s[j] = MulRn(s[j], inv);
}

// Whether expert j is among the first `n` chosen.
__device__ __forceinline__ bool Chosen(const int32_t* idx, int64_t n,
                                       int64_t j) {
  for (int64_t i = 0; i < n; ++i) {
    if (idx[i] == j) return true;
  }
  return false;
}

// One thread per token: scores, then k passes for the largest score + bias
// (strictly greater wins, so among equal values the lower expert), then the
// combine weights.
__global__ void RouterForwardKernel(RouterParams p) {
  const int64_t e = p.experts, k = p.topk;
  for (int64_t r = ThreadIndex(); r < p.tokens; r += Stride()) {
    float* s = p.scores + r * e;
    ScoreRow(p.logits + r * e, e, p.sigmoid, s);
    int32_t* idx = p.indices + r * k;
    for (int64_t i = 0; i < k; ++i) {
      int64_t best = -1;
      float best_value = 0.0f;
      for (int64_t j = 0; j < e; ++j) {
        if (Chosen(idx, i, j)) continue;
        const float v = p.bias ? AddRn(s[j], p.bias[j]) : s[j];
        if (best < 0 || v > best_value) {
          best = j;
          best_value = v;
        }
      }
      idx[i] = static_cast<int32_t>(best);
    }
    float denom = 1.0f;
    if (p.normalize) {
      denom = 0.0f;
      for (int64_t i = 0; i < k; ++i) denom = AddRn(denom, s[idx[i]]);
    }
    float* w = p.weights + r * k;
    for (int64_t i = 0; i < k; ++i) {
      w[i] = MulRn(p.scaling, s[idx[i]]) / denom;
    }
  }
}

// ds_j of one token for the combine weights (zero unless j is chosen).
__device__ __forceinline__ float CombineGrad(const float* s, const int32_t* idx,
                                             const float* dw, int64_t k,
                                             bool normalize, float c, float sum,
                                             float dot, int64_t j) {
  float ds = 0.0f;
  for (int64_t i = 0; i < k; ++i) {
    if (idx[i] != j) continue;
    if (normalize) {
      // c (dw_i S - sum_i dw_i s_i) / S^2.
      ds =
          AddRn(ds, MulRn(c, AddRn(MulRn(dw[i], sum), -dot)) / MulRn(sum, sum));
    } else {
      ds = AddRn(ds, MulRn(c, dw[i]));
    }
  }
  return ds;
}

// One thread per token: dlogits overwritten with J^T ds.
__global__ void RouterBackwardKernel(RouterParams p) {
  const int64_t e = p.experts, k = p.topk;
  for (int64_t r = ThreadIndex(); r < p.tokens; r += Stride()) {
    const float* s = p.scores + r * e;
    const int32_t* idx = p.indices + r * k;
    const float* dw = p.dweights + r * k;
    float sum = 0.0f, dot = 0.0f;
    if (p.normalize) {
      for (int64_t i = 0; i < k; ++i) {
        // An index outside [0, e) reads nothing (the CPU kernel refuses it).
        const float si = idx[i] >= 0 && idx[i] < e ? s[idx[i]] : NAN;
        sum = AddRn(sum, si);
        dot = AddRn(dot, MulRn(dw[i], si));
      }
    }
    float* dl = p.dlogits + r * e;
    if (p.sigmoid) {
      for (int64_t j = 0; j < e; ++j) {
        const float ds =
            CombineGrad(s, idx, dw, k, p.normalize, p.scaling, sum, dot, j);
        dl[j] = MulRn(MulRn(ds, s[j]), 1.0f - s[j]);
      }
      continue;
    }
    float sdot = 0.0f;
    for (int64_t j = 0; j < e; ++j) {
      const float ds =
          CombineGrad(s, idx, dw, k, p.normalize, p.scaling, sum, dot, j);
      sdot = AddRn(sdot, MulRn(s[j], ds));
    }
    for (int64_t j = 0; j < e; ++j) {
      const float ds =
          CombineGrad(s, idx, dw, k, p.normalize, p.scaling, sum, dot, j);
      dl[j] = MulRn(s[j], ds - sdot);
    }
  }
}

struct BalanceParams {
  const float* scores = nullptr;     // [tokens, experts]
  const int32_t* indices = nullptr;  // [tokens, topk]
  float* z = nullptr;         // sigmoid: [tokens] scratch, sum_e s + 1e-20
  int64_t* counts = nullptr;  // [sequences, experts] scratch
  double* psum = nullptr;     // [sequences, experts] scratch, or null
  float* loss = nullptr;      // [1]
  float* dlogits = nullptr;   // backward: [tokens, experts], accumulated
  int64_t tokens = 0, experts = 0, topk = 0, sequences = 1;
  // Under context parallelism: the whole sequences' length (0: this
  // rank's, tokens / sequences); the loss and backward kernels then read
  // the whole sequences' counts from `counts` (the launcher points it there).
  int64_t length = 0;
  bool sigmoid = false;
  float coeff = 0.0f, grad_scale = 1.0f;
};

__device__ __forceinline__ int64_t BalanceLength(const BalanceParams& p) {
  return p.length > 0 ? p.length : p.tokens / p.sequences;
}

// Sigmoid only: each token's normaliser, as AuxProbsRow.
__global__ void BalanceNormaliserKernel(BalanceParams p) {
  const int64_t e = p.experts;
  for (int64_t r = ThreadIndex(); r < p.tokens; r += Stride()) {
    const float* s = p.scores + r * e;
    float z = 0.0f;
    for (int64_t j = 0; j < e; ++j) z = AddRn(z, s[j]);
    p.z[r] = AddRn(z, 1e-20f);
  }
}

// One thread per (sequence g, expert j): the copies routed to j from g's
// tokens, and (when psum is set) the sum over those tokens, in token order,
// of their probability for j, in float64.
__global__ void BalanceCountsKernel(BalanceParams p) {
  const int64_t e = p.experts, k = p.topk, seqs = p.sequences;
  for (int64_t c = ThreadIndex(); c < seqs * e; c += Stride()) {
    const int64_t g = c / e, j = c % e;
    int64_t count = 0;
    double psum = 0.0;
    for (int64_t r = g; r < p.tokens; r += seqs) {
      const int32_t* idx = p.indices + r * k;
      for (int64_t i = 0; i < k; ++i) count += idx[i] == j;
      if (p.psum != nullptr) {
        const float s = p.scores[r * e + j];
        psum = DAddRn(psum, p.sigmoid ? s / p.z[r] : s);
      }
    }
    p.counts[c] = count;
    if (p.psum != nullptr) p.psum[c] = psum;
  }
}

// One thread: coeff * mean over sequences of E * sum_e f_e P_e, summed in
// sequence then expert order.
__global__ void BalanceLossKernel(BalanceParams p) {
  if (ThreadIndex() != 0) return;
  const int64_t e = p.experts, seqs = p.sequences;
  const int64_t len = BalanceLength(p);
  double total = 0.0;
  for (int64_t g = 0; g < seqs; ++g) {
    double run = 0.0;
    for (int64_t j = 0; j < e; ++j) {
      const double f =
          static_cast<double>(p.counts[g * e + j]) / (len * p.topk);
      run = DAddRn(run, DMulRn(f, p.psum[g * e + j] / len));
    }
    total = DAddRn(total, DMulRn(static_cast<double>(e), run));
  }
  p.loss[0] = static_cast<float>(static_cast<double>(p.coeff) * total / seqs);
}

// dL/dp for token r's sequence and expert j, as the CPU kernel's table.
__device__ __forceinline__ float BalanceGrad(const BalanceParams& p, int64_t g,
                                             int64_t j) {
  const int64_t e = p.experts, seqs = p.sequences;
  const int64_t len = BalanceLength(p);
  const double f = static_cast<double>(p.counts[g * e + j]) / (len * p.topk);
  return static_cast<float>(static_cast<double>(p.grad_scale) * p.coeff * e *
                            f / (len * seqs));
}

// One thread per token: dlogits += the balancing loss's gradient (counts
// from BalanceCountsKernel).
__global__ void BalanceBackwardKernel(BalanceParams p) {
  const int64_t e = p.experts;
  for (int64_t r = ThreadIndex(); r < p.tokens; r += Stride()) {
    const int64_t g = r % p.sequences;
    const float* s = p.scores + r * e;
    float* dl = p.dlogits + r * e;
    if (!p.sigmoid) {
      float dot = 0.0f;
      for (int64_t j = 0; j < e; ++j) {
        dot = AddRn(dot, MulRn(s[j], BalanceGrad(p, g, j)));
      }
      for (int64_t j = 0; j < e; ++j) {
        dl[j] = AddRn(dl[j], MulRn(s[j], BalanceGrad(p, g, j) - dot));
      }
      continue;
    }
    float z = 0.0f;
    for (int64_t j = 0; j < e; ++j) z = AddRn(z, s[j]);
    z = AddRn(z, 1e-20f);
    float dot = 0.0f;
    for (int64_t j = 0; j < e; ++j) {
      dot = AddRn(dot, MulRn(s[j] / z, BalanceGrad(p, g, j)));
    }
    for (int64_t j = 0; j < e; ++j) {
      const float ds = (BalanceGrad(p, g, j) - dot) / z;
      dl[j] = AddRn(dl[j], MulRn(MulRn(ds, s[j]), 1.0f - s[j]));
    }
  }
}

// logsumexp of one row, in float64, as LogSumExpRow.
__device__ __forceinline__ double LogSumExp(const float* l, int64_t e) {
  double mx = l[0];
  for (int64_t j = 1; j < e; ++j) mx = mx < l[j] ? l[j] : mx;
  double sum = 0.0;
  for (int64_t j = 0; j < e; ++j) sum = DAddRn(sum, exp(l[j] - mx));
  return mx + log(sum);
}

// One thread per token: lse^2 into terms [tokens].
__global__ void ZLossTermsKernel(const float* logits, int64_t tokens,
                                 int64_t experts, double* terms) {
  for (int64_t r = ThreadIndex(); r < tokens; r += Stride()) {
    const double lse = LogSumExp(logits + r * experts, experts);
    terms[r] = DMulRn(lse, lse);
  }
}

// One block of kBlockThreads: out[0] = scale * (terms[0] + ... + terms[n-1])
// / n (0 when n == 0); thread t sums its contiguous share in order, thread 0
// adds the shares in thread order.
__global__ void MeanOfTermsKernel(const double* terms, int64_t n, float scale,
                                  float* out) {
  double* share = reinterpret_cast<double*>(SharedFloats());
  const int64_t t = threadIdx.x, threads = blockDim.x;
  const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
  double sum = 0.0;
  for (int64_t i = lo; i < hi; ++i) sum = DAddRn(sum, terms[i]);
  share[t] = sum;
  __syncthreads();
  if (t != 0) return;
  double total = 0.0;
  for (int64_t i = 0; i < threads; ++i) total = DAddRn(total, share[i]);
  out[0] =
      static_cast<float>(n > 0 ? static_cast<double>(scale) * total / n : 0.0);
}

// One thread per token: dlogits += grad_scale * coeff * 2 lse softmax / T.
__global__ void ZLossBackwardKernel(const float* logits, int64_t tokens,
                                    int64_t experts, float coeff,
                                    float grad_scale, float* dlogits) {
  for (int64_t r = ThreadIndex(); r < tokens; r += Stride()) {
    const float* l = logits + r * experts;
    const double lse = LogSumExp(l, experts);
    const double scale =
        static_cast<double>(grad_scale) * coeff * 2.0 * lse / tokens;
    float* dl = dlogits + r * experts;
    for (int64_t j = 0; j < experts; ++j) {
      dl[j] = AddRn(dl[j], static_cast<float>(DMulRn(scale, exp(l[j] - lse))));
    }
  }
}

// One thread: bias_e += rate * sign(mean - n_e).
__global__ void UpdateExpertBiasKernel(const int64_t* counts, int64_t experts,
                                       float rate, float* bias) {
  if (ThreadIndex() != 0) return;
  int64_t total = 0;
  for (int64_t j = 0; j < experts; ++j) total += counts[j];
  const double mean = static_cast<double>(total) / experts;
  for (int64_t j = 0; j < experts; ++j) {
    const double offset = mean - static_cast<double>(counts[j]);
    bias[j] = AddRn(bias[j], offset > 0 ? rate : (offset < 0 ? -rate : 0.0f));
  }
}

struct SortParams {
  const int32_t* indices = nullptr;  // [slots]
  int32_t* row_to_slot = nullptr;    // [slots]
  int32_t* slot_to_row = nullptr;    // [slots]
  int64_t* counts = nullptr;         // [experts]
  int64_t slots = 0, experts = 0;
};

// Block e: counts[e] = the slots routed to expert e (each thread counts a
// strided share, thread 0 adds the shares in order).
__global__ void SortCountKernel(SortParams p) {
  int32_t* share = reinterpret_cast<int32_t*>(SharedFloats());
  const int64_t e = blockIdx.x;
  int32_t mine = 0;
  for (int64_t s = threadIdx.x; s < p.slots; s += blockDim.x) {
    mine += p.indices[s] == e;
  }
  share[threadIdx.x] = mine;
  __syncthreads();
  if (threadIdx.x != 0) return;
  int64_t total = 0;
  for (unsigned int t = 0; t < blockDim.x; ++t) total += share[t];
  p.counts[e] = total;
}

// Block e: expert e's rows start after the earlier experts' counts; its
// slots take them in slot order (expert, then token, then choice: the CPU's
// stable counting sort), through a block-wide inclusive scan of "slot s
// goes to e" over chunks of blockDim.x slots.
__global__ void SortScatterKernel(SortParams p) {
  int32_t* scan = reinterpret_cast<int32_t*>(SharedFloats());
  const int64_t e = blockIdx.x;
  const int t = threadIdx.x, threads = blockDim.x;
  int64_t base = 0;
  for (int64_t x = 0; x < e; ++x) base += p.counts[x];
  for (int64_t c0 = 0; c0 < p.slots; c0 += threads) {
    const int64_t s = c0 + t;
    const int32_t mine = s < p.slots && p.indices[s] == e ? 1 : 0;
    scan[t] = mine;
    __syncthreads();
    for (int offset = 1; offset < threads; offset <<= 1) {
      const int32_t add = t >= offset ? scan[t - offset] : 0;
      __syncthreads();
      scan[t] += add;
      __syncthreads();
    }
    if (mine) {
      const int64_t row = base + scan[t] - 1;
      p.row_to_slot[row] = static_cast<int32_t>(s);
      p.slot_to_row[s] = static_cast<int32_t>(row);
    }
    base += scan[threads - 1];
    __syncthreads();  // Every thread has read scan before the next chunk.
  }
}

// A slot routed outside [0, experts) gets no row: its slot_to_row and the
// rows past the counted ones are -1, which the permutation kernels turn
// into NaN rows instead of reading out of bounds (the CPU kernel refuses
// such indices; the device cannot without synchronising).
__global__ void SortMarkInvalidKernel(SortParams p) {
  int64_t total = 0;
  for (int64_t x = 0; x < p.experts; ++x) total += p.counts[x];
  for (int64_t s = ThreadIndex(); s < p.slots; s += Stride()) {
    if (p.indices[s] < 0 || p.indices[s] >= p.experts) p.slot_to_row[s] = -1;
    if (s >= total) p.row_to_slot[s] = -1;
  }
}

// permuted[r] = x[row_to_slot[r] / k], copied as raw elements of
// `elem_bytes` (2 or 4); an index outside [0, rows) gives a NaN row.
__global__ void PermuteKernel(const void* x, ElemType t, int elem_bytes,
                              const int32_t* row_to_slot, int64_t rows,
                              int64_t k, int64_t h, void* permuted) {
  const int64_t n = rows * h;
  for (int64_t i = ThreadIndex(); i < n; i += Stride()) {
    const int64_t r = i / h, j = i % h;
    const int64_t s = row_to_slot[r];
    if (s < 0 || s >= rows) {
      internal::StoreAs(permuted, t, i, NAN);
      continue;
    }
    const int64_t src = (s / k) * h + j;
    if (elem_bytes == 2) {
      static_cast<uint16_t*>(permuted)[i] =
          static_cast<const uint16_t*>(x)[src];
    } else {
      static_cast<uint32_t*>(permuted)[i] =
          static_cast<const uint32_t*>(x)[src];
    }
  }
}

// One thread per (token, column): y = sum over i in order of weights[t, i]
// * expert_out[slot_to_row[t k + i]], in fp32, rounded once.
__global__ void UnpermuteKernel(const void* expert_out, ElemType t,
                                const int32_t* slot_to_row,
                                const float* weights, int64_t tokens, int64_t k,
                                int64_t h, void* y) {
  const int64_t n = tokens * h, rows = tokens * k;
  for (int64_t i = ThreadIndex(); i < n; i += Stride()) {
    const int64_t token = i / h, j = i % h;
    float acc = 0.0f;
    for (int64_t c = 0; c < k; ++c) {
      const int64_t s = token * k + c, r = slot_to_row[s];
      const float v =
          r >= 0 && r < rows ? internal::LoadAs(expert_out, t, r * h + j) : NAN;
      acc = AddRn(acc, MulRn(weights ? weights[s] : 1.0f, v));
    }
    internal::StoreAs(y, t, i, acc);
  }
}

// One thread per (slot, column): dexpert_out[slot_to_row[s]] = weights[s] *
// dy[s / k], rounded once.
__global__ void UnpermuteBackwardRowsKernel(const void* dy, ElemType t,
                                            const int32_t* slot_to_row,
                                            const float* weights, int64_t rows,
                                            int64_t k, int64_t h,
                                            void* dexpert_out) {
  const int64_t n = rows * h;
  for (int64_t i = ThreadIndex(); i < n; i += Stride()) {
    const int64_t s = i / h, j = i % h, r = slot_to_row[s];
    if (r < 0 || r >= rows) continue;
    const float g = internal::LoadAs(dy, t, (s / k) * h + j);
    internal::StoreAs(dexpert_out, t, r * h + j,
                      MulRn(weights ? weights[s] : 1.0f, g));
  }
}

// One warp per slot: dweights[s] = <dy[s / k], expert_out[slot_to_row[s]]>
// in float64; lane l sums columns l, l + 32, ... in order, lane 0 adds the
// lanes in order. Blocks of kBlockThreads threads.
__global__ void UnpermuteBackwardWeightsKernel(const void* dy,
                                               const void* expert_out,
                                               ElemType t,
                                               const int32_t* slot_to_row,
                                               int64_t rows, int64_t k,
                                               int64_t h, float* dweights) {
  double* lanes = reinterpret_cast<double*>(SharedFloats());
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  for (int64_t s0 = blockIdx.x * int64_t{warps}; s0 < rows;
       s0 += int64_t{gridDim.x} * warps) {
    const int64_t s = s0 + warp;
    double sum = 0.0;
    if (s < rows) {
      const int64_t r = slot_to_row[s];
      const bool valid = r >= 0 && r < rows;
      for (int64_t j = lane; j < h; j += 32) {
        const double g = internal::LoadAs(dy, t, (s / k) * h + j);
        const double o = valid ? internal::LoadAs(expert_out, t, r * h + j)
                               : static_cast<double>(NAN);
        sum = DAddRn(sum, DMulRn(g, o));
      }
    }
    lanes[threadIdx.x] = sum;
    __syncthreads();
    if (lane == 0 && s < rows) {
      double total = 0.0;
      for (int l = 0; l < 32; ++l) total = DAddRn(total, lanes[warp * 32 + l]);
      dweights[s] = static_cast<float>(total);
    }
    __syncthreads();
  }
}

}  // namespace moe
}  // namespace cuda_kernels
}  // namespace mcc

#endif  // CORE_OPS_CUDA_MOE_KERNELS_CUH_
