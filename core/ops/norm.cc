#include "core/ops/norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/nn_internal.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {
namespace {

using nn::Load8;
using nn::LoadS;
using nn::Store8;
using nn::StoreS;

// Rows per parallel chunk: enough work to be worth a thread hand-off.
int64_t RowGrain(int64_t hidden) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(hidden, 1));
}

// Checks shared by both norms. beta may be null (RMSNorm).
absl::Status CheckNormArgs(absl::string_view op, const Tensor& x,
                           const Tensor& gamma, const Tensor* beta,
                           int64_t* rows, int64_t* hidden) {
  MCC_RETURN_IF_ERROR(nn::Defined(op, "x", &x));
  MCC_RETURN_IF_ERROR(nn::Defined(op, "gamma", &gamma));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, "x", x));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, "gamma", gamma));
  if (x.dim() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": x must have at least one dimension, got ", x.Describe()));
  }
  *hidden = x.size(-1);
  *rows = *hidden == 0 ? 0 : x.numel() / *hidden;
  if (gamma.dim() != 1 || gamma.size(0) != *hidden) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": gamma ", gamma.Describe(), " must be [", *hidden,
                     "], the last dimension of x ", x.Describe()));
  }
  MCC_RETURN_IF_ERROR(nn::SameDevice(op, "x", x, "gamma", gamma));
  if (beta != nullptr) {
    MCC_RETURN_IF_ERROR(nn::Defined(op, "beta", beta));
    MCC_RETURN_IF_ERROR(nn::IsFloat(op, "beta", *beta));
    MCC_RETURN_IF_ERROR(nn::SameShape(op, "gamma", gamma, "beta", *beta));
    MCC_RETURN_IF_ERROR(nn::SameDevice(op, "x", x, "beta", *beta));
  }
  return absl::OkStatus();
}

// A per-row fp32 statistic (mean or rstd) with `rows` elements.
absl::Status CheckStat(absl::string_view op, const char* name, const Tensor* s,
                       const Tensor& x, int64_t rows) {
  MCC_RETURN_IF_ERROR(nn::Defined(op, name, s));
  MCC_RETURN_IF_ERROR(nn::IsF32(op, name, *s));
  if (s->numel() != rows) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " ", s->Describe(), " must hold one value per row (",
        rows, ") of x ", x.Describe()));
  }
  return nn::SameDevice(op, "x", x, name, *s);
}

// An output with x's shape, fp32 or bf16.
absl::Status CheckLikeX(absl::string_view op, const char* name, const Tensor* t,
                        const Tensor& x) {
  MCC_RETURN_IF_ERROR(nn::Defined(op, name, t));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, name, *t));
  MCC_RETURN_IF_ERROR(nn::SameShape(op, "x", x, name, *t));
  return nn::SameDevice(op, "x", x, name, *t);
}

// An fp32 [hidden] parameter gradient (null allowed: skipped).
absl::Status CheckParamGrad(absl::string_view op, const char* name,
                            const Tensor* g, const Tensor& gamma,
                            const Tensor& x) {
  if (g == nullptr) return absl::OkStatus();
  MCC_RETURN_IF_ERROR(nn::Defined(op, name, g));
  MCC_RETURN_IF_ERROR(nn::IsF32(op, name, *g));
  MCC_RETURN_IF_ERROR(nn::SameShape(op, "gamma", gamma, name, *g));
  return nn::SameDevice(op, "x", x, name, *g);
}

template <bool kLayer, typename TX, typename TY, typename TG>
void NormForwardCpu(const TX* x, const TG* gamma, const TG* beta, float eps,
                    int64_t rows, int64_t h, TY* y, float* mean_out,
                    float* rstd_out) {
  ThreadPool::Global().ParallelFor(
      rows, RowGrain(h), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const TX* xr = x + r * h;
          TY* yr = y + r * h;
          float mean = 0.0f;
          if (kLayer) {
            __m256 acc = _mm256_setzero_ps();
            int64_t i = 0;
            for (; i + 8 <= h; i += 8) acc = _mm256_add_ps(acc, Load8(xr + i));
            float s = nn::HSum(acc);
            for (; i < h; ++i) s += LoadS(xr + i);
            mean = s / static_cast<float>(h);
          }
          const __m256 vmean = _mm256_set1_ps(mean);
          __m256 acc = _mm256_setzero_ps();
          int64_t i = 0;
          for (; i + 8 <= h; i += 8) {
            const __m256 d = _mm256_sub_ps(Load8(xr + i), vmean);
            acc = _mm256_fmadd_ps(d, d, acc);
          }
          float ss = nn::HSum(acc);
          for (; i < h; ++i) {
            const float d = LoadS(xr + i) - mean;
            ss += d * d;
          }
          const float rstd = 1.0f / std::sqrt(ss / static_cast<float>(h) + eps);
          const __m256 vrstd = _mm256_set1_ps(rstd);
          i = 0;
          for (; i + 8 <= h; i += 8) {
            const __m256 xhat =
                _mm256_mul_ps(_mm256_sub_ps(Load8(xr + i), vmean), vrstd);
            __m256 out = _mm256_mul_ps(xhat, Load8(gamma + i));
            if (kLayer) out = _mm256_add_ps(out, Load8(beta + i));
            Store8(yr + i, out);
          }
          for (; i < h; ++i) {
            float out = (LoadS(xr + i) - mean) * rstd * LoadS(gamma + i);
            if (kLayer) out += LoadS(beta + i);
            StoreS(yr + i, out);
          }
          if (kLayer) mean_out[r] = mean;
          rstd_out[r] = rstd;
        }
      });
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma (the
// mean(g) term only for LayerNorm); dgamma += sum dy * xhat, dbeta += sum dy.
// Parameter gradients go through per-chunk fp32 partials, summed in a fixed
// order, so results do not depend on thread timing.
template <bool kLayer, typename TD, typename TX, typename TG, typename TO>
void NormBackwardCpu(const TD* dy, const TX* x, const TG* gamma,
                     const float* mean_in, const float* rstd_in, int64_t rows,
                     int64_t h, TO* dx, float* dgamma, float* dbeta) {
  const bool want_params = dgamma != nullptr || dbeta != nullptr;
  const int64_t num_chunks = std::max<int64_t>(1, std::min<int64_t>(rows, 32));
  const int64_t rows_per_chunk =
      rows == 0 ? 1 : (rows + num_chunks - 1) / num_chunks;
  Tensor partial;
  float* pg = nullptr;
  float* pb = nullptr;
  if (want_params) {
    partial = Tensor::Zeros({2, num_chunks, h}, DType::kFloat32);
    pg = partial.data<float>();
    pb = pg + num_chunks * h;
  }
  const float inv_h = 1.0f / static_cast<float>(h);
  ThreadPool::Global().ParallelFor(num_chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* cg = want_params ? pg + c * h : nullptr;
      float* cb = want_params ? pb + c * h : nullptr;
      const int64_t rend = std::min(rows, (c + 1) * rows_per_chunk);
      for (int64_t r = c * rows_per_chunk; r < rend; ++r) {
        const TD* dyr = dy + r * h;
        const TX* xr = x + r * h;
        TO* dxr = dx + r * h;
        const float mean = kLayer ? mean_in[r] : 0.0f;
        const float rstd = rstd_in[r];
        const __m256 vmean = _mm256_set1_ps(mean);
        const __m256 vrstd = _mm256_set1_ps(rstd);
        __m256 sg = _mm256_setzero_ps();
        __m256 sgx = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= h; i += 8) {
          const __m256 d = Load8(dyr + i);
          const __m256 xhat =
              _mm256_mul_ps(_mm256_sub_ps(Load8(xr + i), vmean), vrstd);
          const __m256 g = _mm256_mul_ps(d, Load8(gamma + i));
          sg = _mm256_add_ps(sg, g);
          sgx = _mm256_fmadd_ps(g, xhat, sgx);
          if (want_params) {
            _mm256_storeu_ps(cg + i,
                             _mm256_fmadd_ps(d, xhat, _mm256_loadu_ps(cg + i)));
            _mm256_storeu_ps(cb + i, _mm256_add_ps(d, _mm256_loadu_ps(cb + i)));
          }
        }
        float sum_g = nn::HSum(sg);
        float sum_gx = nn::HSum(sgx);
        for (; i < h; ++i) {
          const float d = LoadS(dyr + i);
          const float xhat = (LoadS(xr + i) - mean) * rstd;
          const float g = d * LoadS(gamma + i);
          sum_g += g;
          sum_gx += g * xhat;
          if (want_params) {
            cg[i] += d * xhat;
            cb[i] += d;
          }
        }
        const float c_g = kLayer ? sum_g * inv_h : 0.0f;
        const float c_gx = sum_gx * inv_h;
        const __m256 vcg = _mm256_set1_ps(c_g);
        const __m256 vcgx = _mm256_set1_ps(c_gx);
        i = 0;
        for (; i + 8 <= h; i += 8) {
          const __m256 xhat =
              _mm256_mul_ps(_mm256_sub_ps(Load8(xr + i), vmean), vrstd);
          const __m256 g = _mm256_mul_ps(Load8(dyr + i), Load8(gamma + i));
          const __m256 v =
              _mm256_sub_ps(_mm256_sub_ps(g, vcg), _mm256_mul_ps(xhat, vcgx));
          Store8(dxr + i, _mm256_mul_ps(v, vrstd));
        }
        for (; i < h; ++i) {
          const float xhat = (LoadS(xr + i) - mean) * rstd;
          const float g = LoadS(dyr + i) * LoadS(gamma + i);
          StoreS(dxr + i, (g - c_g - xhat * c_gx) * rstd);
        }
      }
    }
  });
  if (!want_params) return;
  ThreadPool::Global().ParallelFor(h, 4096, [&](int64_t i0, int64_t i1) {
    for (int64_t c = 0; c < num_chunks; ++c) {
      const float* cg = pg + c * h;
      const float* cb = pb + c * h;
      for (int64_t i = i0; i < i1; ++i) {
        if (dgamma != nullptr) dgamma[i] += cg[i];
        if (kLayer && dbeta != nullptr) dbeta[i] += cb[i];
      }
    }
  });
}

template <bool kLayer>
absl::Status CheckNormForward(absl::string_view op, const Tensor& x,
                              const Tensor& gamma, const Tensor* beta,
                              float eps, Tensor* y, Tensor* mean,
                              Tensor* rstd) {
  int64_t rows = 0, h = 0;
  MCC_RETURN_IF_ERROR(CheckNormArgs(op, x, gamma, beta, &rows, &h));
  MCC_RETURN_IF_ERROR(CheckLikeX(op, "y", y, x));
  if (kLayer) MCC_RETURN_IF_ERROR(CheckStat(op, "mean", mean, x, rows));
  MCC_RETURN_IF_ERROR(CheckStat(op, "rstd", rstd, x, rows));
  if (beta != nullptr && beta->dtype() != gamma.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": beta ", beta->Describe(), " and gamma ",
                     gamma.Describe(), " must have the same dtype"));
  }
  if (!(eps >= 0.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": eps must be >= 0, got ", eps));
  }
  return absl::OkStatus();
}

template <bool kLayer>
void RunNormForward(const Tensor& x, const Tensor& gamma, const Tensor* beta,
                    float eps, Tensor* y, Tensor* mean, Tensor* rstd) {
  const int64_t h = gamma.numel();
  const int64_t rows = h == 0 ? 0 : x.numel() / h;
  if (rows == 0) return;
  nn::DispatchFloat(x.dtype(), [&](auto tx) {
    using TX = decltype(tx);
    nn::DispatchFloat(y->dtype(), [&](auto ty) {
      using TY = decltype(ty);
      nn::DispatchFloat(gamma.dtype(), [&](auto tg) {
        using TG = decltype(tg);
        NormForwardCpu<kLayer>(
            x.data<TX>(), gamma.data<TG>(), kLayer ? beta->data<TG>() : nullptr,
            eps, rows, h, y->data<TY>(), kLayer ? mean->data<float>() : nullptr,
            rstd->data<float>());
      });
    });
  });
}

template <bool kLayer>
absl::Status CheckNormBackward(absl::string_view op, const Tensor& dy,
                               const Tensor& x, const Tensor& gamma,
                               const Tensor* mean, const Tensor& rstd,
                               Tensor* dx, Tensor* dgamma, Tensor* dbeta) {
  int64_t rows = 0, h = 0;
  MCC_RETURN_IF_ERROR(CheckNormArgs(op, x, gamma, nullptr, &rows, &h));
  MCC_RETURN_IF_ERROR(nn::Defined(op, "dy", &dy));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, "dy", dy));
  MCC_RETURN_IF_ERROR(nn::SameShape(op, "x", x, "dy", dy));
  MCC_RETURN_IF_ERROR(nn::SameDevice(op, "x", x, "dy", dy));
  if (kLayer) MCC_RETURN_IF_ERROR(CheckStat(op, "mean", mean, x, rows));
  MCC_RETURN_IF_ERROR(CheckStat(op, "rstd", &rstd, x, rows));
  MCC_RETURN_IF_ERROR(CheckLikeX(op, "dx", dx, x));
  MCC_RETURN_IF_ERROR(CheckParamGrad(op, "dgamma", dgamma, gamma, x));
  if (kLayer) MCC_RETURN_IF_ERROR(CheckParamGrad(op, "dbeta", dbeta, gamma, x));
  if (rows == 0) return absl::OkStatus();
  return CheckOne16BitType(
      op, {{"dy", &dy}, {"x", &x}, {"gamma", &gamma}, {"dx", dx}});
}

template <bool kLayer>
void RunNormBackward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                     const Tensor* mean, const Tensor& rstd, Tensor* dx,
                     Tensor* dgamma, Tensor* dbeta) {
  const int64_t h = gamma.numel();
  const int64_t rows = h == 0 ? 0 : x.numel() / h;
  if (rows == 0) return;
  float* dg = dgamma != nullptr ? dgamma->data<float>() : nullptr;
  float* db = kLayer && dbeta != nullptr ? dbeta->data<float>() : nullptr;
  Dispatch16BitType(
      {dy.dtype(), x.dtype(), gamma.dtype(), dx->dtype()}, [&](auto th) {
        using H = decltype(th);
        DispatchFloatOr<H>(dy.dtype(), [&](auto td) {
          using TD = decltype(td);
          DispatchFloatOr<H>(x.dtype(), [&](auto tx) {
            using TX = decltype(tx);
            DispatchFloatOr<H>(gamma.dtype(), [&](auto tg) {
              using TG = decltype(tg);
              DispatchFloatOr<H>(dx->dtype(), [&](auto to) {
                using TO = decltype(to);
                NormBackwardCpu<kLayer>(
                    dy.data<TD>(), x.data<TX>(), gamma.data<TG>(),
                    kLayer ? mean->data<float>() : nullptr, rstd.data<float>(),
                    rows, h, dx->data<TO>(), dg, db);
              });
            });
          });
        });
      });
}

absl::Status LayerNormForwardCpu(const Tensor& x, const Tensor& gamma,
                                 const Tensor& beta, float eps, Tensor* y,
                                 Tensor* mean, Tensor* rstd) {
  RunNormForward<true>(x, gamma, &beta, eps, y, mean, rstd);
  return absl::OkStatus();
}

absl::Status LayerNormBackwardCpu(const Tensor& dy, const Tensor& x,
                                  const Tensor& gamma, const Tensor& mean,
                                  const Tensor& rstd, Tensor* dx,
                                  Tensor* dgamma, Tensor* dbeta) {
  RunNormBackward<true>(dy, x, gamma, &mean, rstd, dx, dgamma, dbeta);
  return absl::OkStatus();
}

absl::Status RMSNormForwardCpu(const Tensor& x, const Tensor& gamma, float eps,
                               Tensor* y, Tensor* rstd) {
  RunNormForward<false>(x, gamma, nullptr, eps, y, nullptr, rstd);
  return absl::OkStatus();
}

absl::Status RMSNormBackwardCpu(const Tensor& dy, const Tensor& x,
                                const Tensor& gamma, const Tensor& rstd,
                                Tensor* dx, Tensor* dgamma) {
  RunNormBackward<false>(dy, x, gamma, nullptr, rstd, dx, dgamma, nullptr);
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(LayerNormForwardKernel, LayerNormForwardKernels,
                "LayerNormForward", &LayerNormForwardCpu);
MCC_KERNEL_SLOT(LayerNormBackwardKernel, LayerNormBackwardKernels,
                "LayerNormBackward", &LayerNormBackwardCpu);
MCC_KERNEL_SLOT(RMSNormForwardKernel, RMSNormForwardKernels, "RMSNormForward",
                &RMSNormForwardCpu);
MCC_KERNEL_SLOT(RMSNormBackwardKernel, RMSNormBackwardKernels,
                "RMSNormBackward", &RMSNormBackwardCpu);

absl::Status LayerNormForward(const Tensor& x, const Tensor& gamma,
                              const Tensor& beta, float eps, Tensor* y,
                              Tensor* mean, Tensor* rstd) {
  ScopedOpTimer op_timer("Norm");
  MCC_RETURN_IF_ERROR(CheckNormForward<true>("LayerNormForward", x, gamma,
                                             &beta, eps, y, mean, rstd));
  return LayerNormForwardKernels()(x.device(), x, gamma, beta, eps, y, mean,
                                   rstd);
}

absl::Status LayerNormBackward(const Tensor& dy, const Tensor& x,
                               const Tensor& gamma, const Tensor& mean,
                               const Tensor& rstd, Tensor* dx, Tensor* dgamma,
                               Tensor* dbeta) {
  ScopedOpTimer op_timer("NormBackward");
  MCC_RETURN_IF_ERROR(CheckNormBackward<true>("LayerNormBackward", dy, x, gamma,
                                              &mean, rstd, dx, dgamma, dbeta));
  return LayerNormBackwardKernels()(x.device(), dy, x, gamma, mean, rstd, dx,
                                    dgamma, dbeta);
}

absl::Status RMSNormForward(const Tensor& x, const Tensor& gamma, float eps,
                            Tensor* y, Tensor* rstd) {
  ScopedOpTimer op_timer("Norm");
  MCC_RETURN_IF_ERROR(CheckNormForward<false>("RMSNormForward", x, gamma,
                                              nullptr, eps, y, nullptr, rstd));
  return RMSNormForwardKernels()(x.device(), x, gamma, eps, y, rstd);
}

absl::Status RMSNormBackward(const Tensor& dy, const Tensor& x,
                             const Tensor& gamma, const Tensor& rstd,
                             Tensor* dx, Tensor* dgamma) {
  ScopedOpTimer op_timer("NormBackward");
  MCC_RETURN_IF_ERROR(CheckNormBackward<false>(
      "RMSNormBackward", dy, x, gamma, nullptr, rstd, dx, dgamma, nullptr));
  return RMSNormBackwardKernels()(x.device(), dy, x, gamma, rstd, dx, dgamma);
}

}  // namespace ops
}  // namespace mcc
