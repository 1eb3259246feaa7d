#include "core/ops/rotary.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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

// cos then sin of each position's angles, [seq, 2, half], computed in
// float64. The last table is kept: every layer asks for the same one.
std::shared_ptr<const std::vector<float>> AngleTable(
    int64_t seq, int64_t half, int64_t rd, const RotaryOptions& options) {
  static absl::Mutex mu(absl::kConstInit);
  static std::shared_ptr<const std::vector<float>>* last =
      new std::shared_ptr<const std::vector<float>>();
  static int64_t last_key[4] = {-1, -1, -1, -1};
  static double last_base = 0.0;
  static Llama3RopeScaling* last_scaling = new Llama3RopeScaling();
  const int64_t key[4] = {seq, half, rd, options.position_offset};
  {
    absl::MutexLock lock(&mu);
    if (*last != nullptr && std::equal(key, key + 4, last_key) &&
        last_base == options.base && *last_scaling == options.llama3) {
      return *last;
    }
  }
  auto table = std::make_shared<std::vector<float>>(seq * 2 * half);
  const std::vector<double> inv_freq = RotaryInverseFrequencies(options, rd);
  float* cs = table->data();
  ThreadPool::Global().ParallelFor(seq, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const double pos = static_cast<double>(t + options.position_offset);
      for (int64_t i = 0; i < half; ++i) {
        const double theta = pos * inv_freq[i];
        cs[t * 2 * half + i] = static_cast<float>(std::cos(theta));
        cs[t * 2 * half + half + i] = static_cast<float>(std::sin(theta));
      }
    }
  });
  absl::MutexLock lock(&mu);
  *last = table;
  std::copy(key, key + 4, last_key);
  last_base = options.base;
  *last_scaling = options.llama3;
  return table;
}

// sign = +1 rotates by theta (forward), -1 by -theta (backward).
template <typename TI, typename TO>
void RotaryCpu(const TI* x, TO* y, int64_t batch, int64_t seq, int64_t heads,
               int64_t d, int64_t rd, const float* cs, float sign) {
  const int64_t half = rd / 2;
  const bool same = static_cast<const void*>(x) == static_cast<const void*>(y);
  const int64_t row = heads * d;
  ThreadPool::Global().ParallelFor(
      batch * seq, std::max<int64_t>(1, 8192 / std::max<int64_t>(row, 1)),
      [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t t = r % seq;
          const float* c = cs + t * 2 * half;
          const float* s = c + half;
          for (int64_t hh = 0; hh < heads; ++hh) {
            const TI* xr = x + r * row + hh * d;
            TO* yr = y + r * row + hh * d;
            int64_t i = 0;
            const __m256 vsign = _mm256_set1_ps(sign);
            for (; i + 8 <= half; i += 8) {
              const __m256 x1 = Load8(xr + i);
              const __m256 x2 = Load8(xr + half + i);
              const __m256 vc = _mm256_loadu_ps(c + i);
              const __m256 vs = _mm256_mul_ps(_mm256_loadu_ps(s + i), vsign);
              Store8(yr + i, _mm256_fmsub_ps(x1, vc, _mm256_mul_ps(x2, vs)));
              Store8(yr + half + i,
                     _mm256_fmadd_ps(x2, vc, _mm256_mul_ps(x1, vs)));
            }
            for (; i < half; ++i) {
              const float x1 = LoadS(xr + i);
              const float x2 = LoadS(xr + half + i);
              const float sn = s[i] * sign;
              StoreS(yr + i, x1 * c[i] - x2 * sn);
              StoreS(yr + half + i, x2 * c[i] + x1 * sn);
            }
            if (!same) {
              for (int64_t j = rd; j < d; ++j) StoreS(yr + j, LoadS(xr + j));
            }
          }
        }
      });
}

absl::Status CheckRotary(absl::string_view op, const Tensor& x,
                         const RotaryOptions& options, Tensor* y, float sign) {
  const char* in = sign > 0 ? "x" : "dy";
  const char* out = sign > 0 ? "y" : "dx";
  MCC_RETURN_IF_ERROR(nn::Defined(op, in, &x));
  MCC_RETURN_IF_ERROR(nn::Defined(op, out, y));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, in, x));
  MCC_RETURN_IF_ERROR(nn::IsFloat(op, out, *y));
  if (x.dim() != 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", in, " must be [batch, seq, heads, head_dim], got ",
        x.Describe()));
  }
  MCC_RETURN_IF_ERROR(nn::SameShape(op, in, x, out, *y));
  MCC_RETURN_IF_ERROR(nn::SameDevice(op, in, x, out, *y));
  const int64_t d = x.size(3);
  const int64_t rd = options.rotary_dim == 0 ? d : options.rotary_dim;
  if (rd < 0 || rd > d || rd % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": rotary_dim ", options.rotary_dim,
        " must be even and at most head_dim ", d, " of ", x.Describe()));
  }
  if (!(options.base > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": base must be positive, got ", options.base));
  }
  MCC_RETURN_IF_ERROR(ValidateLlama3RopeScaling(options.llama3));
  if (options.position_offset < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": position_offset must be >= 0, got ", options.position_offset));
  }
  if (x.SharesStorageWith(*y) &&
      (x.raw_data() != y->raw_data() || x.dtype() != y->dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", out, " overlaps ", in, " without being the same tensor"));
  }
  return absl::OkStatus();
}

void RunRotary(const Tensor& x, const RotaryOptions& options, Tensor* y,
               float sign) {
  const int64_t d = x.size(3);
  const int64_t rd = options.rotary_dim == 0 ? d : options.rotary_dim;
  const int64_t batch = x.size(0), seq = x.size(1), heads = x.size(2);
  if (x.numel() == 0) return;
  const int64_t half = rd / 2;
  const std::shared_ptr<const std::vector<float>> table =
      AngleTable(seq, half, rd, options);
  const float* cs = table->data();
  nn::DispatchFloat(x.dtype(), [&](auto ti) {
    using TI = decltype(ti);
    nn::DispatchFloat(y->dtype(), [&](auto to) {
      using TO = decltype(to);
      RotaryCpu(x.data<TI>(), y->data<TO>(), batch, seq, heads, d, rd, cs,
                sign);
    });
  });
}

absl::Status RotaryForwardCpu(const Tensor& x, const RotaryOptions& options,
                              Tensor* y) {
  RunRotary(x, options, y, 1.0f);
  return absl::OkStatus();
}

absl::Status RotaryBackwardCpu(const Tensor& dy, const RotaryOptions& options,
                               Tensor* dx) {
  RunRotary(dy, options, dx, -1.0f);
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateLlama3RopeScaling(const Llama3RopeScaling& scaling) {
  if (!scaling.enabled) return absl::OkStatus();
  if (!(scaling.factor >= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope_scaling (llama3): factor must be >= 1, got ", scaling.factor));
  }
  if (!(scaling.low_freq_factor > 0.0) ||
      !(scaling.high_freq_factor > scaling.low_freq_factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rope_scaling (llama3): need 0 < low_freq_factor < high_freq_factor, "
        "got low_freq_factor ",
        scaling.low_freq_factor, " and high_freq_factor ",
        scaling.high_freq_factor));
  }
  if (scaling.original_max_position_embeddings <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rope_scaling (llama3): original_max_position_embeddings "
                     "must be positive, got ",
                     scaling.original_max_position_embeddings));
  }
  return absl::OkStatus();
}

std::vector<double> RotaryInverseFrequencies(const RotaryOptions& options,
                                             int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] = std::pow(options.base, -2.0 * static_cast<double>(i) /
                                             static_cast<double>(rotary_dim));
  }
  const Llama3RopeScaling& s = options.llama3;
  if (!s.enabled) return inv_freq;
  const double context =
      static_cast<double>(s.original_max_position_embeddings);
  // Wavelengths above this are divided by factor, below high_wavelen kept.
  const double low_wavelen = context / s.low_freq_factor;
  const double high_wavelen = context / s.high_freq_factor;
  constexpr double kPi = 3.14159265358979323846;
  for (double& f : inv_freq) {
    const double wavelen = 2.0 * kPi / f;
    if (wavelen < high_wavelen) continue;
    if (wavelen > low_wavelen) {
      f /= s.factor;
      continue;
    }
    const double smooth = (context / wavelen - s.low_freq_factor) /
                          (s.high_freq_factor - s.low_freq_factor);
    f = (1.0 - smooth) * f / s.factor + smooth * f;
  }
  return inv_freq;
}

MCC_KERNEL_SLOT(RotaryKernel, RotaryForwardKernels, "RotaryForward",
                &RotaryForwardCpu);

MCC_KERNEL_SLOT(RotaryKernel, RotaryBackwardKernels, "RotaryBackward",
                &RotaryBackwardCpu);

absl::Status RotaryForward(const Tensor& x, const RotaryOptions& options,
                           Tensor* y) {
  ScopedOpTimer op_timer("Rotary");
  MCC_RETURN_IF_ERROR(CheckRotary("RotaryForward", x, options, y, 1.0f));
  return RotaryForwardKernels()(x.device(), x, options, y);
}

absl::Status RotaryBackward(const Tensor& dy, const RotaryOptions& options,
                            Tensor* dx) {
  ScopedOpTimer op_timer("Rotary");
  MCC_RETURN_IF_ERROR(CheckRotary("RotaryBackward", dy, options, dx, -1.0f));
  return RotaryBackwardKernels()(dy.device(), dy, options, dx);
}

}  // namespace ops
}  // namespace mcc
