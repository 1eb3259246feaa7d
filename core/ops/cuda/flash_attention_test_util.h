// Shared by the flash-attention kernel tests (flash_attention_test.cc on a
// GPU, flash_attention_emulated_test.cc on the host emulator): the cases,
// random inputs, and per-element error bounds for comparing a kernel with
// the CPU kernel of core/ops/attention.cc.
//
// Bounds. u = 2^-24. Both kernels compute in fp32 from the same inputs
// (16-bit inputs are identical values on both sides), so they differ only by
// rounding order, exp/log and the final rounding to a 16-bit output. For
// query row i and key j: the score s_ij = sum_x (scale q_ix) k_jx, summed in
// any order, is within d u A_ij of the exact value, A_ij = sum_x |scale
// q_ix k_jx|; each side's exp (CPU Exp8 and CUDA expf, 2 ulp each, plus the
// rounding of its argument) adds 4u + u (|s_ij| + |m_i|). So the two sides'
// probabilities differ relatively by at most
//   E = 2 d u max A + 2u max(|s| + |lse|) + 8u,
// and a sum of n terms in a different order by 2 n u of its magnitude.
//   out_ix:  2 (2E + 4 s u + 4u) M_ix, M_ix = sum_j P_ij c_ij |v_jx|
//   lse_i:   2 (E + 2 s u + 2u |lse_i| + 4u)
// The backward gets identical q, k, v, out, dout and lse on both sides. P
// is within E relatively; dP_ij = dO_i . v_j within 2 d u B_ij (B_ij =
// sum_x |dO_ix v_jx|); D_i within 2 d u C_i (C_i = sum_x |dO_ix O_ix|); so
// dS_ij = P_ij (c_ij dP_ij - D_i) within (E + 2 d u + 4u) G_ij, G_ij =
// P_ij (c_ij B_ij + C_i). With n = (heads per kv head) s terms per dK, dV
// element:
//   dV_jx:  2 (E + 2 n u + 2u) sum_i P_ij c_ij |dO_ix|
//   dK_jx:  2 (E + 2 d u + 4u + 2 n u) sum_i G_ij |scale q_ix|
//   dQ_ix:  2 (E + 2 d u + 4u + 2 s u) scale sum_j G_ij |k_jx|
// (the factor 2 is a safety margin over the first-order terms). A 16-bit
// output adds one ulp of its type at the larger value (each side rounds
// once). c_ij is 1/(1-p) or 0 with dropout (the same mask on both sides:
// a different mask gives errors of the order of the values, far outside).
//
// The tensor-core forward (flash_attention_mma_kernels.cuh) differs from
// fp32 arithmetic in two ways (ForwardArithmetic below):
//  - tensor cores add their fp32 accumulators with truncation, not round to
//    nearest (up to 2u a step instead of u), and the kernel scales the
//    score after the product instead of q before it: the score and the P V
//    sums get twice their fp32 terms (E's 2 d u max A and out's 4 s u);
//  - P is rounded to q's 16-bit type (unit roundoff u_p: 2^-8 for bf16,
//    2^-11 for fp16) for P V, while l sums the fp32 P: every term P_ij
//    v_jx / l gains a relative error u_p, so out gains u_p M_ix; fp16
//    flushes P below 2^-24 to its subnormal grid (an absolute 2^-25 a
//    term, not relative; l >= 1), so out gains 2^-25 V_ix, V_ix = sum_j
//    c_ij |v_jx|. bf16 has fp32's range (no such term).
// Products of 16-bit values are exact in fp32, so nothing else changes; lse
// sums the fp32 P and keeps its bound but for E. With the factor 2:
//   out_ix: 2 (2 E' + 8 s u + 4u + u_p) M_ix + 2 a_p V_ix,
//   E' = E + 2 d u max A.
// For bf16 u_p = 2^-8 dominates: out within about 2^-7 of M_ix (the sum of
// P |v| along the row), against about 2^-18 for the fp32 kernel.
//
// The tensor-core backward (flash_attention_mma_backward_kernels.cuh,
// BackwardArithmetic below) recomputes the score with truncating sums (E'
// as the forward's), sums dP = dO . v with them (4 d u B_ij instead of 2 d
// u B_ij), rounds dO to q's type when its type differs (u_o = u_p, else
// 0: a relative u_o of dP and of dV's terms), rounds P c (for dV) and dS
// (for dK, dQ) to q's type before their products (u_p of each term; fp16's
// subnormal flush adds an absolute a_p = 2^-25 a term), sums dK, dV and dQ
// with truncating adds (4 n u, 4 s u) and scales dK and dQ after the sum
// (u). With F = E' + 4 d u + 4u + u_o + u_p + u and the factor 2:
//   dV_jx:  2 (E' + 4 n u + 3u + u_o + u_p) sum_i P_ij c_ij |dO_ix|
//           + 2 a_p sum_{i: c_ij > 0} |dO_ix|
//   dK_jx:  2 (F + 4 n u) sum_i G_ij |scale q_ix| + 2 a_p sum_i |scale q_ix|
//   dQ_ix:  2 (F + 4 s u) scale sum_j G_ij |k_jx| + 2 a_p scale sum_j |k_jx|
// (sums over the visible pairs). D is the SIMT kernels' RowDotKernel's on
// both paths. For bf16 u_p = 2^-8 dominates, as in the forward.
#ifndef CORE_OPS_CUDA_FLASH_ATTENTION_TEST_UTIL_H_
#define CORE_OPS_CUDA_FLASH_ATTENTION_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/attention.h"
#include "core/ops/dropout.h"
#include "core/tensor.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace flash_testing {

// The bounds below take the CPU kernel as fp32 arithmetic on the 16-bit
// inputs: bf16 runs the CPU's widened path, not its AVX512-BF16 one (which
// rounds P and dS to bf16 for their products). Tests register it with
// ::testing::AddGlobalTestEnvironment.
class WidenedCpuBf16Attention : public ::testing::Environment {
 public:
  void SetUp() override {
    saved_ = internal::SetCpuBf16AttentionPathForTesting(
        CpuBf16AttentionPath::kWidened);
  }
  void TearDown() override {
    internal::SetCpuBf16AttentionPathForTesting(saved_);
  }

 private:
  CpuBf16AttentionPath saved_ = CpuBf16AttentionPath::kWidened;
};

struct AttentionCase {
  int64_t b, s, hq, hkv, d;
  bool causal;
  DType dtype;       // q, k, v
  DType out_dtype;   // out, dout
  DType grad_dtype;  // dq, dk, dv
  float dropout = 0.0f;
  int64_t head_offset = 0, total_heads = 0;

  std::string Name() const {
    return absl::StrCat("b", b, " s", s, " hq", hq, " hkv", hkv, " d", d,
                        causal ? " causal" : " full", " ", DTypeName(dtype),
                        "->", DTypeName(out_dtype), " grads ",
                        DTypeName(grad_dtype), " dropout ", dropout, " heads ",
                        head_offset, "/", total_heads);
  }
  AttentionOptions Options() const {
    AttentionOptions o;
    o.causal = causal;
    o.dropout_p = dropout;
    o.dropout_seed = 0x1234567887654321ull;
    o.dropout_offset = 1001;  // Not a multiple of 4: words start mid-block.
    o.head_offset = head_offset;
    o.total_heads = total_heads;
    return o;
  }
};

inline Tensor RandomTensor(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> v(NumElements(shape));
  for (float& x : v) x = dist(gen);
  return *Tensor::FromVector(v, shape, dtype);
}

struct HostInputs {
  Tensor q, k, v, dout;
};

inline HostInputs MakeInputs(const AttentionCase& c, uint32_t seed) {
  HostInputs in;
  in.q = RandomTensor({c.b, c.s, c.hq, c.d}, c.dtype, seed);
  in.k = RandomTensor({c.b, c.s, c.hkv, c.d}, c.dtype, seed + 1);
  in.v = RandomTensor({c.b, c.s, c.hkv, c.d}, c.dtype, seed + 2);
  in.dout = RandomTensor({c.b, c.s, c.hq, c.d}, c.out_dtype, seed + 3);
  return in;
}

// The CPU kernel's results (the reference).
struct Results {
  Tensor out, lse, dq, dk, dv;
};

inline Results EmptyResults(const AttentionCase& c, Device device) {
  Results r;
  r.out = Tensor::Empty({c.b, c.s, c.hq, c.d}, c.out_dtype, device);
  r.lse = Tensor::Empty({c.b, c.hq, c.s}, DType::kFloat32, device);
  r.dq = Tensor::Empty({c.b, c.s, c.hq, c.d}, c.grad_dtype, device);
  r.dk = Tensor::Empty({c.b, c.s, c.hkv, c.d}, c.grad_dtype, device);
  r.dv = Tensor::Empty({c.b, c.s, c.hkv, c.d}, c.grad_dtype, device);
  return r;
}

// Bounds (before the 16-bit output's ulp) per element of each result.
struct Bounds {
  std::vector<double> out, lse, dq, dk, dv;
};

// How the forward kernel under test computes (the default: fp32 arithmetic).
struct ForwardArithmetic {
  bool truncating_accumulation = false;  // tensor cores' fp32 sums
  double p_unit_roundoff = 0.0;          // P rounded to a 16-bit type for P V
  double p_subnormal_step = 0.0;         // half the spacing of its subnormals
};

// The tensor-core forward's arithmetic for 16-bit inputs of type `dtype`.
inline ForwardArithmetic TensorCoreForward(DType dtype) {
  ForwardArithmetic a;
  a.truncating_accumulation = true;
  a.p_unit_roundoff = dtype == DType::kFloat16 ? 1.0 / 2048 : 1.0 / 256;
  a.p_subnormal_step = dtype == DType::kFloat16 ? std::ldexp(1.0, -25) : 0.0;
  return a;
}

// How the backward kernels under test compute (the default: fp32).
struct BackwardArithmetic {
  bool truncating_accumulation = false;  // tensor cores' fp32 sums
  double operand_unit_roundoff = 0.0;    // P c and dS rounded for products
  double operand_subnormal_step = 0.0;   // half the spacing of subnormals
  double dout_unit_roundoff = 0.0;       // dO rounded to q's type
};

// The tensor-core backward's arithmetic for 16-bit q, k, v of type `dtype`
// and dout of type `out_dtype`.
inline BackwardArithmetic TensorCoreBackward(DType dtype, DType out_dtype) {
  BackwardArithmetic a;
  a.truncating_accumulation = true;
  a.operand_unit_roundoff = dtype == DType::kFloat16 ? 1.0 / 2048 : 1.0 / 256;
  a.operand_subnormal_step =
      dtype == DType::kFloat16 ? std::ldexp(1.0, -25) : 0.0;
  a.dout_unit_roundoff = out_dtype == dtype ? 0.0 : a.operand_unit_roundoff;
  return a;
}

// `out` and `lse` are the forward results both backward kernels were given.
inline Bounds AttentionBounds(const AttentionCase& c, const HostInputs& in,
                              const Tensor& out, const Tensor& lse,
                              const ForwardArithmetic& fa = {},
                              const Tensor& first_key = Tensor(),
                              const BackwardArithmetic& ba = {}) {
  constexpr double u = 1.0 / (1 << 24);
  const AttentionOptions o = c.Options();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  const float scale_f = 1.0f / std::sqrt(static_cast<float>(c.d));
  const std::vector<double> q = in.q.ToDoubles(), k = in.k.ToDoubles(),
                            v = in.v.ToDoubles(), dout = in.dout.ToDoubles(),
                            ov = out.ToDoubles(), lv = lse.ToDoubles();
  const int64_t b = c.b, s = c.s, hq = c.hq, hkv = c.hkv, d = c.d;
  const int64_t group = hq / hkv;
  const int64_t total = c.total_heads > 0 ? c.total_heads : hq;
  const uint32_t threshold = static_cast<uint32_t>(
      std::lround(static_cast<double>(c.dropout) * (1 << 24)));
  const double keep = c.dropout > 0 ? 1.0 / (1.0 - c.dropout) : 1.0;
  auto qi = [&](int64_t bi, int64_t i, int64_t h, int64_t x) {
    return ((bi * s + i) * hq + h) * d + x;
  };
  auto ki = [&](int64_t bi, int64_t j, int64_t h, int64_t x) {
    return ((bi * s + j) * hkv + h) * d + x;
  };
  // Pass 1: E over everything.
  double amax = 0.0, smax = 0.0, lmax = 0.0;
  // Rows that see no key (first_key) have lse -inf and bounds 0.
  for (double x : lv) {
    if (std::isfinite(x)) lmax = std::max(lmax, std::fabs(x));
  }
  const std::vector<double> fk =
      first_key.defined() ? first_key.ToDoubles() : std::vector<double>();
  std::vector<double> sv(s), av(s), pv(s), cv(s), gv(s);
  Bounds bd;
  bd.out.assign(out.numel(), 0.0);
  bd.lse.assign(lse.numel(), 0.0);
  bd.dq.assign(out.numel(), 0.0);
  bd.dk.assign(in.k.numel(), 0.0);
  bd.dv.assign(in.k.numel(), 0.0);
  std::vector<double> mag_out(out.numel()), sum_v(out.numel()),
      mag_dq(out.numel()), mag_dk(in.k.numel()), mag_dv(in.k.numel());
  // The sums the subnormal flush of 16-bit P c and dS scales.
  std::vector<double> flush_dq(out.numel()), flush_dk(in.k.numel()),
      flush_dv(in.k.numel());
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < s; ++i) {
        const int64_t jend = c.causal ? i + 1 : s;
        const int64_t jbegin =
            fk.empty()
                ? 0
                : std::max<int64_t>(0, static_cast<int64_t>(fk[bi * s + i]));
        if (jbegin >= jend) continue;
        double m = -INFINITY;
        for (int64_t j = jbegin; j < jend; ++j) {
          double dot = 0.0, abs_dot = 0.0;
          for (int64_t x = 0; x < d; ++x) {
            // q scaled in fp32 as both kernels do.
            const double qs = static_cast<float>(
                static_cast<float>(q[qi(bi, i, h, x)]) * scale_f);
            dot += qs * k[ki(bi, j, kvh, x)];
            abs_dot += std::fabs(qs * k[ki(bi, j, kvh, x)]);
          }
          sv[j] = dot;
          av[j] = abs_dot;
          amax = std::max(amax, abs_dot);
          smax = std::max(smax, std::fabs(dot));
          m = std::max(m, dot);
        }
        double l = 0.0;
        for (int64_t j = jbegin; j < jend; ++j) l += std::exp(sv[j] - m);
        const double lse_exact = m + std::log(l);
        double row_c = 0.0;  // C_i
        for (int64_t x = 0; x < d; ++x) {
          row_c += std::fabs(dout[qi(bi, i, h, x)] * ov[qi(bi, i, h, x)]);
        }
        for (int64_t j = jbegin; j < jend; ++j) {
          pv[j] = std::exp(sv[j] - lse_exact);
          cv[j] = 1.0;
          if (c.dropout > 0) {
            uint32_t w;
            PhiloxStream(
                o.dropout_seed,
                o.dropout_offset +
                    ((static_cast<uint64_t>(bi) * total + c.head_offset + h) *
                         s +
                     i) *
                        s +
                    j,
                1, &w);
            cv[j] = (w >> 8) >= threshold ? keep : 0.0;
          }
          double b_ij = 0.0;
          for (int64_t x = 0; x < d; ++x) {
            b_ij += std::fabs(dout[qi(bi, i, h, x)] * v[ki(bi, j, kvh, x)]);
          }
          gv[j] = pv[j] * (cv[j] * b_ij + row_c);
        }
        for (int64_t x = 0; x < d; ++x) {
          double mo = 0.0, mq = 0.0, sv_x = 0.0, sk_x = 0.0;
          for (int64_t j = jbegin; j < jend; ++j) {
            mo += pv[j] * cv[j] * std::fabs(v[ki(bi, j, kvh, x)]);
            sv_x += cv[j] * std::fabs(v[ki(bi, j, kvh, x)]);
            mq += gv[j] * std::fabs(k[ki(bi, j, kvh, x)]);
            sk_x += std::fabs(k[ki(bi, j, kvh, x)]);
            const int64_t kx = ki(bi, j, kvh, x);
            mag_dv[kx] += pv[j] * cv[j] * std::fabs(dout[qi(bi, i, h, x)]);
            mag_dk[kx] += gv[j] * std::fabs(q[qi(bi, i, h, x)] * scale);
            if (cv[j] > 0) flush_dv[kx] += std::fabs(dout[qi(bi, i, h, x)]);
            flush_dk[kx] += std::fabs(q[qi(bi, i, h, x)] * scale);
          }
          mag_out[qi(bi, i, h, x)] = mo;
          sum_v[qi(bi, i, h, x)] = sv_x;
          mag_dq[qi(bi, i, h, x)] = scale * mq;
          flush_dq[qi(bi, i, h, x)] = scale * sk_x;
        }
      }
    }
  }
  const double e = 2 * d * u * amax + 2 * u * (smax + lmax) + 8 * u;
  const double n = static_cast<double>(group * s);
  const double acc = fa.truncating_accumulation ? 2.0 : 1.0;
  const double e_fwd = e + (acc - 1) * 2 * d * u * amax;
  // The backward's: with fp32 arithmetic (ba = {}) the terms reduce to the
  // SIMT kernels' (E + 2 d u + 4u for dS, 2 n u for a sum of n terms).
  const double bacc = ba.truncating_accumulation ? 2.0 : 1.0;
  const double e_bwd = e + (bacc - 1) * 2 * d * u * amax;
  const double u_o = ba.dout_unit_roundoff, u_op = ba.operand_unit_roundoff;
  const double late_scale = ba.truncating_accumulation ? u : 0.0;
  const double ds_rel = e_bwd + 2 * bacc * d * u + 4 * u + u_o + u_op +
                        late_scale;  // F, with dS's own rounding
  const double a_op = ba.operand_subnormal_step;
  for (size_t i = 0; i < bd.out.size(); ++i) {
    bd.out[i] = 2 * (2 * e_fwd + 4 * acc * s * u + 4 * u + fa.p_unit_roundoff) *
                    mag_out[i] +
                2 * fa.p_subnormal_step * sum_v[i];
    bd.dq[i] =
        2 * (ds_rel + 2 * bacc * s * u) * mag_dq[i] + 2 * a_op * flush_dq[i];
  }
  for (size_t i = 0; i < bd.lse.size(); ++i) {
    bd.lse[i] = 2 * (e_fwd + 2 * s * u + 2 * u * std::fabs(lv[i]) + 4 * u);
  }
  for (size_t i = 0; i < bd.dk.size(); ++i) {
    bd.dv[i] =
        2 * (e_bwd + 2 * bacc * n * u + 2 * u + late_scale + u_o + u_op) *
            mag_dv[i] +
        2 * a_op * flush_dv[i];
    bd.dk[i] =
        2 * (ds_rel + 2 * bacc * n * u) * mag_dk[i] + 2 * a_op * flush_dk[i];
  }
  return bd;
}

// The spacing of dtype's values at |v| (fp32: 0, its rounding is in the
// bounds above), not below the subnormal spacing.
inline double Ulp(DType dt, double v) {
  if (dt == DType::kFloat32) return 0.0;
  const int digits = dt == DType::kBFloat16 ? 8 : 11;
  const int emin = dt == DType::kFloat16 ? -14 : -126;
  const int e = v == 0 ? emin : std::max(std::ilogb(v), emin);
  return std::ldexp(1.0, e - (digits - 1));
}

// Every |got - want| <= bound + one ulp of got's dtype at |want| + bound;
// reports the count out of bound and the worst element.
inline ::testing::AssertionResult Near(const char* what, const Tensor& got,
                                       const Tensor& want,
                                       const std::vector<double>& bound) {
  const std::vector<double> g = got.ToDoubles(), w = want.ToDoubles();
  if (g.size() != w.size() || bound.size() != w.size()) {
    return ::testing::AssertionFailure() << what << ": sizes differ";
  }
  int64_t bad = 0;
  size_t worst = 0;
  double worst_ratio = -1.0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double b =
        bound[i] + Ulp(got.dtype(), std::fabs(w[i]) + bound[i]) + 1e-30;
    const double err = std::fabs(g[i] - w[i]);
    if (err <= b) continue;
    ++bad;
    const double ratio = std::isnan(err) ? INFINITY : err / b;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": " << bad << " of " << g.size()
         << " elements out of bound; worst at " << worst << ": got " << g[worst]
         << ", want " << w[worst] << ", |diff| "
         << std::fabs(g[worst] - w[worst]) << " > bound "
         << bound[worst] + Ulp(got.dtype(), std::fabs(w[worst]) + bound[worst]);
}

// The cases both tests run: odd sequence lengths (1, 17, 19, 129), head
// dims 33, 64, 80, 128, 200 and 256 (every padded kernel size), causal and not,
// GQA, every input dtype, 16-bit inputs with fp32 outputs or gradients, dropout
// (also on a tensor-parallel rank's heads).
inline std::vector<AttentionCase> Cases() {
  const DType f32 = DType::kFloat32, bf16 = DType::kBFloat16,
              f16 = DType::kFloat16;
  return {
      {2, 17, 4, 2, 64, true, f32, f32, f32},
      {1, 129, 2, 2, 64, false, f32, f32, f32},
      {1, 1, 2, 1, 64, true, f32, f32, f32},
      {2, 129, 4, 1, 128, true, bf16, bf16, bf16},
      {1, 65, 2, 2, 128, false, f16, f16, f16},
      {1, 129, 2, 1, 80, true, f32, f32, f32},
      {1, 70, 2, 2, 200, true, f32, f32, f32},
      {1, 33, 2, 1, 256, false, bf16, f32, f32},
      {1, 97, 2, 1, 128, true, bf16, bf16, bf16, 0.1f},
      {2, 40, 2, 2, 64, false, f32, f32, f32, 0.25f, 2, 8},
      {1, 129, 2, 2, 64, true, f16, f32, f16, 0.1f},
      {1, 19, 3, 1, 33, true, bf16, bf16, f32, 0.2f},
  };
}

// ---- Cached attention (core/ops/cached_attention.h) -------------------------

struct CachedCase {
  int64_t b, n, heads, groups, d, position, capacity;
  DType dtype;  // q and out

  std::string Name() const {
    return absl::StrCat("b", b, " n", n, " heads", heads, " groups", groups,
                        " d", d, " position", position, " capacity", capacity,
                        " ", DTypeName(dtype));
  }
};

// Decode (n = 1) and a prefill chunk, positions 0 and past a few hundred
// keys, head dims 64, 80 and 128, GQA, every q dtype.
inline std::vector<CachedCase> CachedCases() {
  const DType f32 = DType::kFloat32, bf16 = DType::kBFloat16,
              f16 = DType::kFloat16;
  return {
      {2, 1, 4, 2, 64, 0, 4, f32},      {2, 1, 4, 1, 128, 300, 305, bf16},
      {1, 5, 4, 4, 80, 37, 45, f32},    {1, 7, 2, 1, 64, 0, 7, f16},
      {1, 3, 8, 2, 128, 129, 140, f32}, {1, 1, 2, 2, 256, 77, 78, bf16},
      {1, 2, 3, 1, 33, 10, 12, f16},
  };
}

// The bound for out (before its dtype's ulp), as for the flash forward:
// scores (q . k) scale within 2 d u A_j + 2 u |s_j| of each other (A_j =
// scale sum |q k|), probabilities within E = 2 d u max A + 2 u max(|s| +
// |m|) + 8u relatively, so out_x within 2 (2E + 4 keys u + 4u) sum_j p_j
// |v_jx| / l.
inline std::vector<double> CachedBound(const CachedCase& c, const Tensor& q,
                                       const Tensor& k, const Tensor& v) {
  constexpr double u = 1.0 / (1 << 24);
  const std::vector<double> qv = q.ToDoubles(), kv = k.ToDoubles(),
                            vv = v.ToDoubles();
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  const int64_t per_group = c.heads / c.groups;
  std::vector<double> bound(q.numel());
  std::vector<double> sc, ab;
  for (int64_t bi = 0; bi < c.b; ++bi) {
    for (int64_t i = 0; i < c.n; ++i) {
      for (int64_t h = 0; h < c.heads; ++h) {
        const int64_t g = h / per_group, keys = c.position + i + 1;
        const int64_t qrow = ((bi * c.n + i) * c.heads + h) * c.d;
        sc.assign(keys, 0.0);
        ab.assign(keys, 0.0);
        double m = -INFINITY, amax = 0.0, smax = 0.0;
        for (int64_t j = 0; j < keys; ++j) {
          const int64_t krow = ((bi * c.capacity + j) * c.groups + g) * c.d;
          for (int64_t x = 0; x < c.d; ++x) {
            sc[j] += qv[qrow + x] * kv[krow + x] * scale;
            ab[j] += std::fabs(qv[qrow + x] * kv[krow + x]) * scale;
          }
          m = std::max(m, sc[j]);
          amax = std::max(amax, ab[j]);
          smax = std::max(smax, std::fabs(sc[j]));
        }
        double l = 0.0;
        for (int64_t j = 0; j < keys; ++j) l += std::exp(sc[j] - m);
        const double e =
            2 * c.d * u * amax + 2 * u * (smax + std::fabs(m)) + 8 * u;
        for (int64_t x = 0; x < c.d; ++x) {
          double mag = 0.0;
          for (int64_t j = 0; j < keys; ++j) {
            const int64_t krow = ((bi * c.capacity + j) * c.groups + g) * c.d;
            mag += std::exp(sc[j] - m) * std::fabs(vv[krow + x]);
          }
          bound[qrow + x] =
              2 * (2 * e + 4 * static_cast<double>(keys) * u + 4 * u) * mag / l;
        }
      }
    }
  }
  return bound;
}

}  // namespace flash_testing
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_CUDA_FLASH_ATTENTION_TEST_UTIL_H_
