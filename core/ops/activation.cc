#include "core/ops/activation.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/ops/bias.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {

#define MCC_DEFINE_SLOT(Type, Name, op)           \
  KernelSlot<Type>& Name() {                      \
    static auto* slot = new KernelSlot<Type>(op); \
    return *slot;                                 \
  }
MCC_DEFINE_SLOT(UnaryKernel, GeluKernels, "Gelu")
MCC_DEFINE_SLOT(UnaryBackwardKernel, GeluBackwardKernels, "GeluBackward")
MCC_DEFINE_SLOT(BiasGeluKernel, BiasGeluKernels, "BiasGelu")
MCC_DEFINE_SLOT(BiasGeluBackwardKernel, BiasGeluBackwardKernels,
                "BiasGeluBackward")
MCC_DEFINE_SLOT(UnaryKernel, SwiGLUKernels, "SwiGLU")
MCC_DEFINE_SLOT(UnaryBackwardKernel, SwiGLUBackwardKernels, "SwiGLUBackward")
#undef MCC_DEFINE_SLOT

namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

// y = gelu(x (+ b)); b may be null.
inline float GeluF(float v) {
  const float t = VecTanh(kSqrt2OverPi * v * (1.0f + kGeluCoeff * v * v));
  return 0.5f * v * (1.0f + t);
}

inline float GeluGradF(float v) {
  const float v2 = v * v;
  const float t = VecTanh(kSqrt2OverPi * v * (1.0f + kGeluCoeff * v2));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * v2);
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

#if defined(__AVX2__)
// 1 / (1 + exp(-x)) with the division replaced by a reciprocal estimate and
// one Newton step (relative error about 2^-22, far inside the 1e-5 the tests
// ask): vdivps was the bottleneck of the 16-bit kernels.
// exp(x) as 2^i * 2^f, i = round(x log2 e), f in [-1/2, 1/2]: a degree-5 fit
// of 2^f (relative error 1.5e-7, fitted for this file) and no Cody-Waite
// step, 4 fewer vector operations than Exp8; x log2 e - i is formed with
// two FMAs (log2 e split in hi + lo) so large |x| loses no accuracy.
// The upper clamp keeps exp(x) finite: 1 + inf would make the Newton step
// below inf * 0 = NaN.
inline __m256 Exp2Poly8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)),
                    _mm256_set1_ps(88.0f));
  const __m256 l2e_hi = _mm256_set1_ps(1.44269502162933349609375f);
  const __m256 l2e_lo = _mm256_set1_ps(1.925963033500011079e-8f);
  const __m256 i = _mm256_round_ps(
      _mm256_mul_ps(x, l2e_hi), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_fmsub_ps(x, l2e_hi, i);
  f = _mm256_fmadd_ps(x, l2e_lo, f);
  __m256 p = _mm256_set1_ps(1.3266970636323094e-3f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.675459936261177e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550742521882057e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022121727466583e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931469440460205e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0000001192092896f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(i), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline __m256 FastSigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 d =
      _mm256_add_ps(one, Exp2Poly8(_mm256_sub_ps(_mm256_setzero_ps(), x)));
  const __m256 r = _mm256_rcp_ps(d);
  // r (2 - d r); exp overflow (d = inf) gives r = 0, as the division did.
  return _mm256_mul_ps(r, _mm256_fnmadd_ps(d, r, _mm256_set1_ps(2.0f)));
}

// 0.5 v (1 + tanh(u)) = v * sigmoid(2u): one exp and one reciprocal.
inline __m256 Gelu8(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 v2 = _mm256_mul_ps(v, v);
  const __m256 u2 =
      _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(2.0f * kSqrt2OverPi), v),
                    _mm256_fmadd_ps(_mm256_set1_ps(kGeluCoeff), v2, one));
  return _mm256_mul_ps(v, FastSigmoid8(u2));
}

// With s = sigmoid(2u): tanh(u) = 2s - 1 and 1 - tanh(u)^2 = 4 s (1 - s).
inline __m256 GeluGrad8(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 c = _mm256_set1_ps(kSqrt2OverPi);
  const __m256 v2 = _mm256_mul_ps(v, v);
  const __m256 u2 =
      _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(c, c), v),
                    _mm256_fmadd_ps(_mm256_set1_ps(kGeluCoeff), v2, one));
  const __m256 s = FastSigmoid8(u2);
  const __m256 du = _mm256_mul_ps(
      c, _mm256_fmadd_ps(_mm256_set1_ps(3.0f * kGeluCoeff), v2, one));
  // 0.5 (1 + t) = s;  0.5 v (1 - t^2) du = 2 v s (1 - s) du.
  const __m256 sech = _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(v, v), s),
                                    _mm256_sub_ps(one, s));
  return _mm256_fmadd_ps(sech, du, s);
}

// The blocks below read and write their tensors' own dtypes, converting in
// registers (Load8 / Store8), so each element is read and written once; the
// tail of fewer than 8 elements goes through the same vector code.

// y = gelu(x (+ b)); b may be null.
template <typename TX, typename TY>
inline void GeluBlock(const TX* x, const float* b, TY* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = Load8(x + i);
    if (b != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(b + i));
    Store8(y + i, Gelu8(v));
  }
  if (i < n) {
    __m256 v = LoadPartial8(x + i, n - i);
    if (b != nullptr) v = _mm256_add_ps(v, LoadPartial8(b + i, n - i));
    StorePartial8(y + i, Gelu8(v), n - i);
  }
}

// dx = dy * gelu'(x (+ b)); with acc non-null also acc += dx (in fp32, before
// dx's rounding to its dtype), for the bias gradient.
template <typename TDY, typename TX, typename TDX>
inline void GeluGradBlock(const TDY* dy, const TX* x, const float* b, TDX* dx,
                          float* acc, int64_t n) {
  auto one8 = [&](__m256 g, __m256 v, int64_t i, int64_t m) {
    if (b != nullptr) {
      v = _mm256_add_ps(
          v, m == 8 ? _mm256_loadu_ps(b + i) : LoadPartial8(b + i, m));
    }
    const __m256 d = _mm256_mul_ps(g, GeluGrad8(v));
    if (m == 8) {
      Store8(dx + i, d);
      if (acc)
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), d));
    } else {
      StorePartial8(dx + i, d, m);
      if (acc) {
        StorePartial8(acc + i, _mm256_add_ps(LoadPartial8(acc + i, m), d), m);
      }
    }
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) one8(Load8(dy + i), Load8(x + i), i, 8);
  if (i < n) {
    one8(LoadPartial8(dy + i, n - i), LoadPartial8(x + i, n - i), i, n - i);
  }
}

// y = silu(a) * b.
template <typename TX, typename TY>
inline void SwiGLUBlock(const TX* a, const TX* b, TY* y, int64_t n) {
  auto f = [](__m256 av, __m256 bv) {
    return _mm256_mul_ps(_mm256_mul_ps(av, FastSigmoid8(av)), bv);
  };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) Store8(y + i, f(Load8(a + i), Load8(b + i)));
  if (i < n) {
    const int64_t m = n - i;
    StorePartial8(y + i, f(LoadPartial8(a + i, m), LoadPartial8(b + i, m)), m);
  }
}

// da = g * b * silu'(a), db = g * silu(a); silu'(a) = s (1 + a (1 - s)).
template <typename TDY, typename TX, typename TDX>
inline void SwiGLUGradBlock(const TDY* g, const TX* a, const TX* b, TDX* da,
                            TDX* db, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  auto f = [&](__m256 gv, __m256 av, __m256 bv, __m256* dav, __m256* dbv) {
    const __m256 s = FastSigmoid8(av);
    const __m256 dsilu =
        _mm256_mul_ps(s, _mm256_fmadd_ps(av, _mm256_sub_ps(one, s), one));
    *dav = _mm256_mul_ps(_mm256_mul_ps(gv, bv), dsilu);
    *dbv = _mm256_mul_ps(gv, _mm256_mul_ps(av, s));
  };
  int64_t i = 0;
  __m256 dav, dbv;
  for (; i + 8 <= n; i += 8) {
    f(Load8(g + i), Load8(a + i), Load8(b + i), &dav, &dbv);
    Store8(da + i, dav);
    Store8(db + i, dbv);
  }
  if (i < n) {
    const int64_t m = n - i;
    f(LoadPartial8(g + i, m), LoadPartial8(a + i, m), LoadPartial8(b + i, m),
      &dav, &dbv);
    StorePartial8(da + i, dav, m);
    StorePartial8(db + i, dbv, m);
  }
}
#else
// Portable fallback: widen into fp32 scratch, compute, narrow.
template <typename TX, typename TY>
inline void GeluBlock(const TX* x, const float* b, TY* y, int64_t n) {
  float xbuf[kBlock], ybuf[kBlock];
  const float* xf = AsF32(x, n, xbuf);
  float* yf = OutF32(y, ybuf);
  for (int64_t i = 0; i < n; ++i) yf[i] = GeluF(b ? xf[i] + b[i] : xf[i]);
  FinishF32(yf, y, n);
}

template <typename TDY, typename TX, typename TDX>
inline void GeluGradBlock(const TDY* dy, const TX* x, const float* b, TDX* dx,
                          float* acc, int64_t n) {
  float xbuf[kBlock], dybuf[kBlock], dxbuf[kBlock];
  const float* xf = AsF32(x, n, xbuf);
  const float* dyf = AsF32(dy, n, dybuf);
  for (int64_t i = 0; i < n; ++i) {
    dxbuf[i] = dyf[i] * GeluGradF(b ? xf[i] + b[i] : xf[i]);
    if (acc) acc[i] += dxbuf[i];
  }
  StoreF32(dxbuf, dx, n);
}

template <typename TX, typename TY>
inline void SwiGLUBlock(const TX* a, const TX* b, TY* y, int64_t n) {
  float abuf[kBlock], bbuf[kBlock], ybuf[kBlock];
  const float* af = AsF32(a, n, abuf);
  const float* bf = AsF32(b, n, bbuf);
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + VecExp(-af[i]));
    ybuf[i] = af[i] * s * bf[i];
  }
  StoreF32(ybuf, y, n);
}

template <typename TDY, typename TX, typename TDX>
inline void SwiGLUGradBlock(const TDY* g, const TX* a, const TX* b, TDX* da,
                            TDX* db, int64_t n) {
  float gbuf[kBlock], abuf[kBlock], bbuf[kBlock], dabuf[kBlock], dbbuf[kBlock];
  const float* gf = AsF32(g, n, gbuf);
  const float* af = AsF32(a, n, abuf);
  const float* bf = AsF32(b, n, bbuf);
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + VecExp(-af[i]));
    dabuf[i] = gf[i] * bf[i] * s * (1.0f + af[i] * (1.0f - s));
    dbbuf[i] = gf[i] * af[i] * s;
  }
  StoreF32(dabuf, da, n);
  StoreF32(dbbuf, db, n);
}
#endif

absl::Status CheckUnary(const char* op, const char* xn, const Tensor& x,
                        const char* yn, const Tensor* y) {
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{xn, &x}, {yn, y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{xn, &x}, {yn, y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {xn, &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {yn, y}));
  return CheckShapeMatches(op, {xn, &x}, {yn, y});
}

// Forward GELU, with or without bias (bias32 null), on CPU tensors.
void GeluForwardCpu(const Tensor& x, const float* bias32, Tensor* y) {
  const int64_t h = bias32 ? x.size(-1) : x.numel();
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(y->dtype(), [&](auto yt) {
      using TX = decltype(xt);
      using TY = decltype(yt);
      const TX* xp = x.data<TX>();
      TY* yp = y->data<TY>();
      ForEachBlock(x.numel(), h, [&](int64_t off, int64_t col, int64_t n) {
        GeluBlock(xp + off, bias32 ? bias32 + col : nullptr, yp + off, n);
      });
    });
  });
}

// dx = dy * gelu'(x + bias).
void GeluBackwardCpu(const Tensor& dy, const Tensor& x, const float* bias32,
                     Tensor* dx) {
  const int64_t h = bias32 ? x.size(-1) : x.numel();
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(dy.dtype(), [&](auto dyt) {
      DispatchFloat(dx->dtype(), [&](auto dxt) {
        using TX = decltype(xt);
        using TDY = decltype(dyt);
        using TDX = decltype(dxt);
        const TX* xp = x.data<TX>();
        const TDY* dyp = dy.data<TDY>();
        TDX* dxp = dx->data<TDX>();
        ForEachBlock(x.numel(), h, [&](int64_t off, int64_t col, int64_t n) {
          GeluGradBlock(dyp + off, xp + off, bias32 ? bias32 + col : nullptr,
                        dxp + off, nullptr, n);
        });
      });
    });
  });
}

}  // namespace

absl::Status Gelu(const Tensor& x, Tensor* y) {
  MCC_RETURN_IF_ERROR(CheckUnary("Gelu", "x", x, "y", y));
  if (!x.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(UnaryKernel k, GeluKernels().Get(x.device()));
    return k(x, y);
  }
  GeluForwardCpu(x, nullptr, y);
  return absl::OkStatus();
}

absl::Status GeluBackward(const Tensor& dy, const Tensor& x, Tensor* dx) {
  const char* op = "GeluBackward";
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "dx", dx));
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "dy", &dy));
  if (!x.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(UnaryBackwardKernel k,
                         GeluBackwardKernels().Get(x.device()));
    return k(dy, x, dx);
  }
  GeluBackwardCpu(dy, x, nullptr, dx);
  return absl::OkStatus();
}

absl::Status BiasGelu(const Tensor& x, const Tensor& bias, Tensor* y) {
  const char* op = "BiasGelu";
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "y", y));
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"bias", &bias}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", &x}, {"bias", &bias}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"bias", &bias}));
  MCC_RETURN_IF_ERROR(internal::CheckBias(op, x, "x", bias));
  if (!x.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(BiasGeluKernel k, BiasGeluKernels().Get(x.device()));
    return k(x, bias, y);
  }
  std::vector<float> b32(bias.numel());
  LoadF32Any(bias, b32.data());
  GeluForwardCpu(x, b32.data(), y);
  return absl::OkStatus();
}

absl::Status BiasGeluBackward(const Tensor& dy, const Tensor& x,
                              const Tensor& bias, Tensor* dx, Tensor* dbias) {
  const char* op = "BiasGeluBackward";
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "dx", dx));
  MCC_RETURN_IF_ERROR(CheckUnary(op, "x", x, "dy", &dy));
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"bias", &bias}, {"dbias", dbias}}));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"x", &x}, {"bias", &bias}, {"dbias", dbias}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"bias", &bias}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"dbias", dbias}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(internal::CheckBias(op, x, "x", bias));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"bias", &bias}, {"dbias", dbias}));
  if (!x.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(BiasGeluBackwardKernel k,
                         BiasGeluBackwardKernels().Get(x.device()));
    return k(dy, x, bias, dx, dbias);
  }
  std::vector<float> b32(bias.numel());
  LoadF32Any(bias, b32.data());
  const int64_t h = x.size(-1);
  const int64_t rows = h == 0 ? 0 : x.numel() / h;
  // One pass: each row's dx is computed in fp32 blocks, stored, and added
  // to its row group's partial bias gradient.
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(dy.dtype(), [&](auto dyt) {
      DispatchFloat(dx->dtype(), [&](auto dxt) {
        using TX = decltype(xt);
        using TDY = decltype(dyt);
        using TDX = decltype(dxt);
        const TX* xp = x.data<TX>();
        const TDY* dyp = dy.data<TDY>();
        TDX* dxp = dx->data<TDX>();
        const float* bp = b32.data();
        internal::ForRowsWithColumnSums(
            rows, h,
            [&](int64_t r, float* acc) {
              for (int64_t j0 = 0; j0 < h; j0 += kBlock) {
                const int64_t n = std::min(kBlock, h - j0);
                const int64_t off = r * h + j0;
                GeluGradBlock(dyp + off, xp + off, bp + j0, dxp + off, acc + j0,
                              n);
              }
            },
            dbias->data<float>());
      });
    });
  });
  return absl::OkStatus();
}

namespace {

absl::Status CheckSwiGLU(const char* op, const Tensor& x, const char* yn,
                         const Tensor* y) {
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}, {yn, y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", &x}, {yn, y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {yn, y}));
  Shape want = x.shape();
  if (x.dim() < 1 || x.size(-1) % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", Brief(x), " and ", yn, " ", Brief(*y),
                     ": x's last dimension must be even (two halves)"));
  }
  want.back() /= 2;
  if (y->shape() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": x ", Brief(x), " and ", yn, " ", Brief(*y), ": ",
                     yn, " should be ", ShapeToString(want)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SwiGLU(const Tensor& x, Tensor* y) {
  MCC_RETURN_IF_ERROR(CheckSwiGLU("SwiGLU", x, "y", y));
  if (!x.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(UnaryKernel k, SwiGLUKernels().Get(x.device()));
    return k(x, y);
  }
  const int64_t h = y->size(-1);
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(y->dtype(), [&](auto yt) {
      using TX = decltype(xt);
      using TY = decltype(yt);
      const TX* xp = x.data<TX>();
      TY* yp = y->data<TY>();
      ForEachBlock(y->numel(), h, [&](int64_t off, int64_t col, int64_t n) {
        const int64_t row = off / h;
        const TX* a = xp + row * 2 * h + col;
        SwiGLUBlock(a, a + h, yp + off, n);
      });
    });
  });
  return absl::OkStatus();
}

absl::Status SwiGLUBackward(const Tensor& dy, const Tensor& x, Tensor* dx) {
  const char* op = "SwiGLUBackward";
  MCC_RETURN_IF_ERROR(CheckSwiGLU(op, x, "dy", &dy));
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"dx", dx}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"dx", dx}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", &x}, {"dx", dx}}));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"x", &x}, {"dx", dx}));
  if (!x.device().is_cpu()) {
    MCC_ASSIGN_OR_RETURN(UnaryBackwardKernel k,
                         SwiGLUBackwardKernels().Get(x.device()));
    return k(dy, x, dx);
  }
  const int64_t h = dy.size(-1);
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(dy.dtype(), [&](auto dyt) {
      DispatchFloat(dx->dtype(), [&](auto dxt) {
        using TX = decltype(xt);
        using TDY = decltype(dyt);
        using TDX = decltype(dxt);
        const TX* xp = x.data<TX>();
        const TDY* dyp = dy.data<TDY>();
        TDX* dxp = dx->data<TDX>();
        ForEachBlock(dy.numel(), h, [&](int64_t off, int64_t col, int64_t n) {
          const int64_t row = off / h;
          const int64_t a_off = row * 2 * h + col, b_off = a_off + h;
          SwiGLUGradBlock(dyp + off, xp + a_off, xp + b_off, dxp + a_off,
                          dxp + b_off, n);
        });
      });
    });
  });
  return absl::OkStatus();
}

}  // namespace ops
}  // namespace mcc
