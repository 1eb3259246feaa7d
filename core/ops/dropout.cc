#include "core/ops/dropout.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace mcc {
namespace ops {
namespace {

constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;

#if defined(__AVX2__)
// hi and lo 32-bit halves of the 8 products c * m.
inline void MulHiLo(__m256i c, __m256i m, __m256i* hi, __m256i* lo) {
  const __m256i even = _mm256_mul_epu32(c, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m);
  *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// The 10 round keys of a seed, broadcast to 8 lanes.
struct RoundKeys {
  __m256i k0[10], k1[10];
  RoundKeys(uint32_t a, uint32_t b) {
    for (int r = 0; r < 10; ++r) {
      k0[r] = _mm256_set1_epi32(static_cast<int>(a));
      k1[r] = _mm256_set1_epi32(static_cast<int>(b));
      a += kW0;
      b += kW1;
    }
  }
};

// Counters j .. j + 7 as (low words, high words).
inline void Counters8(uint64_t j, __m256i* lo_out, __m256i* hi_out) {
  const uint32_t lo = static_cast<uint32_t>(j);
  if (lo <= 0xffffffffu - 7) {
    *lo_out = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(lo)),
                               _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    *hi_out = _mm256_set1_epi32(static_cast<int>(j >> 32));
    return;
  }
  alignas(32) uint32_t l[8], h[8];  // The low word wraps in this group.
  for (int i = 0; i < 8; ++i) {
    l[i] = static_cast<uint32_t>(j + i);
    h[i] = static_cast<uint32_t>((j + i) >> 32);
  }
  *lo_out = _mm256_load_si256(reinterpret_cast<const __m256i*>(l));
  *hi_out = _mm256_load_si256(reinterpret_cast<const __m256i*>(h));
}

// Stores 8 blocks (word r of block i in c[r], lane i) in stream order.
inline void StoreBlocks8(const __m256i c[4], uint32_t* out) {
  const __m256i t0 = _mm256_unpacklo_epi32(c[0], c[1]);
  const __m256i t1 = _mm256_unpackhi_epi32(c[0], c[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(c[2], c[3]);
  const __m256i t3 = _mm256_unpackhi_epi32(c[2], c[3]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2);  // blocks 0 | 4
  const __m256i u1 = _mm256_unpackhi_epi64(t0, t2);  // blocks 1 | 5
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3);  // blocks 2 | 6
  const __m256i u3 = _mm256_unpackhi_epi64(t1, t3);  // blocks 3 | 7
  __m256i* o = reinterpret_cast<__m256i*>(out);
  _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(u0, u1, 0x20));
  _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
  _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
  _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
}

// 16 Philox blocks for counters j .. j + 15: 64 words in stream order. Two
// independent groups of 8 interleave, hiding the multiplies' latency.
inline void Philox16(uint64_t j, const RoundKeys& keys, uint32_t* out) {
  __m256i a[4], b[4];
  Counters8(j, &a[0], &a[1]);
  Counters8(j + 8, &b[0], &b[1]);
  a[2] = a[3] = b[2] = b[3] = _mm256_setzero_si256();
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(kM1));
  for (int r = 0; r < 10; ++r) {
    __m256i ahi0, alo0, ahi1, alo1, bhi0, blo0, bhi1, blo1;
    MulHiLo(a[0], m0, &ahi0, &alo0);
    MulHiLo(b[0], m0, &bhi0, &blo0);
    MulHiLo(a[2], m1, &ahi1, &alo1);
    MulHiLo(b[2], m1, &bhi1, &blo1);
    a[0] = _mm256_xor_si256(_mm256_xor_si256(ahi1, a[1]), keys.k0[r]);
    b[0] = _mm256_xor_si256(_mm256_xor_si256(bhi1, b[1]), keys.k0[r]);
    a[1] = alo1;
    b[1] = blo1;
    a[2] = _mm256_xor_si256(_mm256_xor_si256(ahi0, a[3]), keys.k1[r]);
    b[2] = _mm256_xor_si256(_mm256_xor_si256(bhi0, b[3]), keys.k1[r]);
    a[3] = alo0;
    b[3] = blo0;
  }
  StoreBlocks8(a, out);
  StoreBlocks8(b, out + 32);
}
#endif

}  // namespace

std::array<uint32_t, 4> Philox4x32_10(std::array<uint32_t, 4> c,
                                      std::array<uint32_t, 2> k) {
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0],
         static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1],
         static_cast<uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

void PhiloxStream(uint64_t seed, uint64_t first, int64_t n, uint32_t* out) {
  const uint32_t k0 = static_cast<uint32_t>(seed);
  const uint32_t k1 = static_cast<uint32_t>(seed >> 32);
  auto block = [&](uint64_t j) {
    return Philox4x32_10(
        {static_cast<uint32_t>(j), static_cast<uint32_t>(j >> 32), 0, 0},
        {k0, k1});
  };
  int64_t i = 0;
  // Leading words up to a block boundary.
  while (i < n && (first + i) % 4 != 0) {
    const uint64_t w = first + i;
    out[i++] = block(w / 4)[w % 4];
  }
#if defined(__AVX2__)
  if (n - i >= 64) {
    const RoundKeys keys(k0, k1);
    for (; i + 64 <= n; i += 64) Philox16((first + i) / 4, keys, out + i);
  }
#endif
  for (; i + 4 <= n; i += 4) {
    const auto b = block((first + i) / 4);
    std::copy(b.begin(), b.end(), out + i);
  }
  if (i < n) {
    const auto b = block((first + i) / 4);
    for (int r = 0; i < n; ++i, ++r) out[i] = b[r];
  }
}

namespace {

#if defined(__AVX2__)
// y = x * (0 or scale) for m <= 8 elements whose stream words are w.
template <typename TX, typename TY>
inline void Mask8(const TX* x, TY* y, const uint32_t* w, int64_t m,
                  __m256i thr_minus_1, __m256 scale) {
  if (m == 8) {
    const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    // (w >> 8) >= thr, as a signed compare: both sides are below 2^24 and
    // thr - 1 = -1 keeps everything when thr = 0.
    const __m256 keep = _mm256_castsi256_ps(
        _mm256_cmpgt_epi32(_mm256_srli_epi32(wv, 8), thr_minus_1));
    // Multiply by 0 or 1/(1-p) (a NaN input stays NaN, as in PyTorch's
    // x * mask * scale).
    Store8(y, _mm256_mul_ps(Load8(x), _mm256_and_ps(keep, scale)));
    return;
  }
  alignas(32) uint32_t wb[8] = {};
  for (int64_t i = 0; i < m; ++i) wb[i] = w[i];
  const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
      _mm256_srli_epi32(_mm256_load_si256(reinterpret_cast<__m256i*>(wb)), 8),
      thr_minus_1));
  StorePartial8(
      y, _mm256_mul_ps(LoadPartial8(x, m), _mm256_and_ps(keep, scale)), m);
}
#endif

// Dropout of n elements whose stream words start at `first`: the Philox
// words are generated 64 at a time into L1 and applied at once, and the
// 16-bit dtypes convert in registers, so each element is read and written
// once.
template <typename TX, typename TY>
void DropoutBlock(const TX* x, TY* y, int64_t n, bool identity, uint64_t seed,
                  uint64_t first, uint32_t threshold, float scale) {
#if defined(__AVX2__)
  if (identity) {
    ConvertInRegisters(x, y, n);
    return;
  }
  int64_t i = 0;
  alignas(32) uint32_t words[64];
  const __m256i thr = _mm256_set1_epi32(static_cast<int>(threshold) - 1);
  const __m256 sc = _mm256_set1_ps(scale);
  auto masked = [&](int64_t at, int64_t m) {  // m <= 64 words at i = at.
    for (int64_t k = 0; k < m; k += 8) {
      Mask8(x + at + k, y + at + k, words + k, std::min<int64_t>(8, m - k), thr,
            sc);
    }
  };
  // Up to the first whole Philox block, then 16 blocks at a time.
  const int64_t head = std::min<int64_t>(n, (4 - first % 4) % 4);
  if (head > 0) {
    PhiloxStream(seed, first, head, words);
    masked(0, head);
    i = head;
  }
  const RoundKeys keys(static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32));
  for (; i + 64 <= n; i += 64) {
    Philox16((first + i) / 4, keys, words);
    for (int64_t k = 0; k < 64; k += 8) {
      Mask8(x + i + k, y + i + k, words + k, 8, thr, sc);
    }
  }
  if (i < n) {
    PhiloxStream(seed, first + i, n - i, words);
    masked(i, n - i);
  }
#else
  float xbuf[kBlock], ybuf[kBlock];
  uint32_t words[kBlock];
  const float* xf = AsF32(x, n, xbuf);
  float* yf = OutF32(y, ybuf);
  if (identity) {
    for (int64_t i = 0; i < n; ++i) yf[i] = xf[i];
  } else {
    PhiloxStream(seed, first, n, words);
    for (int64_t i = 0; i < n; ++i) {
      const float keep = (words[i] >> 8) >= threshold ? scale : 0.0f;
      yf[i] = xf[i] * keep;
    }
  }
  FinishF32(yf, y, n);
#endif
}

absl::Status DropoutCpu(const Tensor& x, float p, uint64_t seed,
                        uint64_t offset, Tensor* y);

absl::Status DropoutImpl(const char* op, const char* xn, const char* yn,
                         const Tensor& x, float p, uint64_t seed,
                         uint64_t offset, Tensor* y) {
  ScopedOpTimer op_timer(op);
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{xn, &x}, {yn, y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{xn, &x}, {yn, y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {xn, &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {yn, y}));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {xn, &x}, {yn, y}));
  if (!(p >= 0.0f && p < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": probability ", p,
                                                   " for ", xn, " ", Brief(x),
                                                   " must be in [0, 1)"));
  }
  return DropoutKernels()(x.device(), x, p, seed, offset, y);
}

absl::Status DropoutCpu(const Tensor& x, float p, uint64_t seed,
                        uint64_t offset, Tensor* y) {
  const uint32_t threshold =
      static_cast<uint32_t>(std::lround(static_cast<double>(p) * (1 << 24)));
  const float scale = 1.0f / (1.0f - p);
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(y->dtype(), [&](auto yt) {
      using TX = decltype(xt);
      using TY = decltype(yt);
      const TX* xp = x.data<TX>();
      TY* yp = y->data<TY>();
      ForEachBlock(x.numel(), x.numel(), [&](int64_t off, int64_t, int64_t n) {
        DropoutBlock(xp + off, yp + off, n, p == 0.0f, seed, offset + off,
                     threshold, scale);
      });
    });
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status Dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset,
                     Tensor* y) {
  return DropoutImpl("Dropout", "x", "y", x, p, seed, offset, y);
}

absl::Status DropoutBackward(const Tensor& dy, float p, uint64_t seed,
                             uint64_t offset, Tensor* dx) {
  return DropoutImpl("DropoutBackward", "dy", "dx", dy, p, seed, offset, dx);
}

MCC_KERNEL_SLOT(DropoutKernel, DropoutKernels, "Dropout", &DropoutCpu);

}  // namespace ops
}  // namespace mcc
