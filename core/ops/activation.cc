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
// 0.5 v (1 + tanh(u)) = v * sigmoid(2u): one exp and one division.
inline __m256 Gelu8(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 v2 = _mm256_mul_ps(v, v);
  const __m256 u2 =
      _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(2.0f * kSqrt2OverPi), v),
                    _mm256_fmadd_ps(_mm256_set1_ps(kGeluCoeff), v2, one));
  return _mm256_mul_ps(v, Sigmoid8(u2));
}

// With s = sigmoid(2u): tanh(u) = 2s - 1 and 1 - tanh(u)^2 = 4 s (1 - s).
inline __m256 GeluGrad8(__m256 v) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 c = _mm256_set1_ps(kSqrt2OverPi);
  const __m256 v2 = _mm256_mul_ps(v, v);
  const __m256 u2 =
      _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(c, c), v),
                    _mm256_fmadd_ps(_mm256_set1_ps(kGeluCoeff), v2, one));
  const __m256 s = Sigmoid8(u2);
  const __m256 du = _mm256_mul_ps(
      c, _mm256_fmadd_ps(_mm256_set1_ps(3.0f * kGeluCoeff), v2, one));
  // 0.5 (1 + t) = s;  0.5 v (1 - t^2) du = 2 v s (1 - s) du.
  const __m256 sech = _mm256_mul_ps(_mm256_mul_ps(_mm256_add_ps(v, v), s),
                                    _mm256_sub_ps(one, s));
  return _mm256_fmadd_ps(sech, du, s);
}
#endif

inline void GeluBlock(const float* x, const float* b, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (b != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(b + i));
    _mm256_storeu_ps(y + i, Gelu8(v));
  }
#endif
  for (; i < n; ++i) y[i] = GeluF(b ? x[i] + b[i] : x[i]);
}

// dx = dy * gelu'(x (+ b)).
inline void GeluGradBlock(const float* dy, const float* x, const float* b,
                          float* dx, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    if (b != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(b + i));
    _mm256_storeu_ps(dx + i,
                     _mm256_mul_ps(_mm256_loadu_ps(dy + i), GeluGrad8(v)));
  }
#endif
  for (; i < n; ++i) dx[i] = dy[i] * GeluGradF(b ? x[i] + b[i] : x[i]);
}

// y = silu(a) * b.
inline void SwiGLUBlock(const float* a, const float* b, float* y, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m256 av = _mm256_loadu_ps(a + i);
    const __m256 silu = _mm256_mul_ps(av, Sigmoid8(av));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(b + i)));
  }
#endif
  for (; i < n; ++i) {
    const float s = 1.0f / (1.0f + VecExp(-a[i]));
    y[i] = a[i] * s * b[i];
  }
}

// da = g * b * silu'(a), db = g * silu(a); silu'(a) = s (1 + a (1 - s)).
inline void SwiGLUGradBlock(const float* g, const float* a, const float* b,
                            float* da, float* db, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 av = _mm256_loadu_ps(a + i);
    const __m256 bv = _mm256_loadu_ps(b + i);
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 s = Sigmoid8(av);
    const __m256 dsilu =
        _mm256_mul_ps(s, _mm256_fmadd_ps(av, _mm256_sub_ps(one, s), one));
    _mm256_storeu_ps(da + i, _mm256_mul_ps(_mm256_mul_ps(gv, bv), dsilu));
    _mm256_storeu_ps(db + i, _mm256_mul_ps(gv, _mm256_mul_ps(av, s)));
  }
#endif
  for (; i < n; ++i) {
    const float s = 1.0f / (1.0f + VecExp(-a[i]));
    da[i] = g[i] * b[i] * s * (1.0f + a[i] * (1.0f - s));
    db[i] = g[i] * a[i] * s;
  }
}

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
        float xbuf[kBlock], ybuf[kBlock];
        const float* xf = AsF32(xp + off, n, xbuf);
        float* yf = OutF32(yp + off, ybuf);
        GeluBlock(xf, bias32 ? bias32 + col : nullptr, yf, n);
        FinishF32(yf, yp + off, n);
      });
    });
  });
}

// dx = dy * gelu'(x + bias); with dx32 non-null, also writes dx in fp32 there
// (for the bias gradient).
void GeluBackwardCpu(const Tensor& dy, const Tensor& x, const float* bias32,
                     Tensor* dx, float* dx32) {
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
          float xbuf[kBlock], dybuf[kBlock], dxbuf[kBlock];
          const float* xf = AsF32(xp + off, n, xbuf);
          const float* dyf = AsF32(dyp + off, n, dybuf);
          float* dxf = dx32 ? dx32 + off : OutF32(dxp + off, dxbuf);
          GeluGradBlock(dyf, xf, bias32 ? bias32 + col : nullptr, dxf, n);
          if (dx32) {
            StoreF32(dxf, dxp + off, n);
          } else {
            FinishF32(dxf, dxp + off, n);
          }
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
  GeluBackwardCpu(dy, x, nullptr, dx, nullptr);
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
              float xbuf[kBlock], dybuf[kBlock], dxbuf[kBlock];
              for (int64_t j0 = 0; j0 < h; j0 += kBlock) {
                const int64_t n = std::min(kBlock, h - j0);
                const int64_t off = r * h + j0;
                const float* xf = AsF32(xp + off, n, xbuf);
                const float* dyf = AsF32(dyp + off, n, dybuf);
                GeluGradBlock(dyf, xf, bp + j0, dxbuf, n);
                StoreF32(dxbuf, dxp + off, n);
                float* a = acc + j0;
                for (int64_t j = 0; j < n; ++j) a[j] += dxbuf[j];
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
        float abuf[kBlock], bbuf[kBlock], ybuf[kBlock];
        const int64_t row = off / h;
        const float* a = AsF32(xp + row * 2 * h + col, n, abuf);
        const float* b = AsF32(xp + row * 2 * h + h + col, n, bbuf);
        float* yf = OutF32(yp + off, ybuf);
        SwiGLUBlock(a, b, yf, n);
        FinishF32(yf, yp + off, n);
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
          float abuf[kBlock], bbuf[kBlock], dybuf[kBlock], dabuf[kBlock],
              dbbuf[kBlock];
          const int64_t row = off / h;
          const int64_t a_off = row * 2 * h + col, b_off = a_off + h;
          const float* a = AsF32(xp + a_off, n, abuf);
          const float* b = AsF32(xp + b_off, n, bbuf);
          const float* g = AsF32(dyp + off, n, dybuf);
          float* da = OutF32(dxp + a_off, dabuf);
          float* db = OutF32(dxp + b_off, dbbuf);
          SwiGLUGradBlock(g, a, b, da, db, n);
          FinishF32(da, dxp + a_off, n);
          FinishF32(db, dxp + b_off, n);
        });
      });
    });
  });
  return absl::OkStatus();
}

}  // namespace ops
}  // namespace mcc
