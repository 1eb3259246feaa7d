#include "core/ops/bias.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"
#include "core/thread_pool.h"

namespace mcc {
namespace ops {

namespace internal {

absl::Status CheckBias(const char* op, const Tensor& x, const char* x_name,
                       const Tensor& bias) {
  if (x.dim() < 1 || bias.dim() != 1 || bias.size(0) != x.size(-1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", x_name, " ", Brief(x), " and bias ", Brief(bias),
                     ": bias must be 1-D with the size of the last dimension"));
  }
  return absl::OkStatus();
}

// Rows per partial sum: partial sums over a fixed number of rows, added in
// row order in float64, make the result independent of the thread count.
constexpr int64_t kRowsPerPartial = 64;

void ForRowsWithColumnSums(
    int64_t rows, int64_t h,
    const std::function<void(int64_t row, float* acc)>& row_fn, float* dbias) {
  if (rows <= 0 || h <= 0) return;
  const int64_t parts = (rows + kRowsPerPartial - 1) / kRowsPerPartial;
  std::vector<float> partial(parts * h);
  ThreadPool::Global().ParallelFor(
      parts, std::max<int64_t>(1, kGrain / (kRowsPerPartial * h + 1)),
      [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          float* acc = partial.data() + p * h;
          std::fill(acc, acc + h, 0.0f);
          const int64_t r1 = std::min(rows, (p + 1) * kRowsPerPartial);
          for (int64_t r = p * kRowsPerPartial; r < r1; ++r) row_fn(r, acc);
        }
      });
  ThreadPool::Global().ParallelFor(h, 256, [&](int64_t j0, int64_t j1) {
    std::vector<double> sum(j1 - j0, 0.0);
    for (int64_t p = 0; p < parts; ++p) {
      const float* acc = partial.data() + p * h;
      for (int64_t j = j0; j < j1; ++j) sum[j - j0] += acc[j];
    }
    for (int64_t j = j0; j < j1; ++j) {
      dbias[j] = static_cast<float>(dbias[j] + sum[j - j0]);
    }
  });
}

namespace {

template <typename T>
void ColumnSums(const T* dy, int64_t rows, int64_t h, float* dbias) {
  ForRowsWithColumnSums(
      rows, h,
      [&](int64_t r, float* acc) {
        const T* row = dy + r * h;
        int64_t j = 0;
#if defined(__AVX2__)
        // Widen in registers: no scratch round trip for 16-bit dy.
        for (; j + 8 <= h; j += 8) {
          _mm256_storeu_ps(
              acc + j, _mm256_add_ps(_mm256_loadu_ps(acc + j), Load8(row + j)));
        }
#endif
        for (; j < h; ++j) acc[j] += ToF32(row[j]);
      },
      dbias);
}

}  // namespace

void AccumulateColumnSums(const float* dy, int64_t rows, int64_t h,
                          float* dbias) {
  ColumnSums(dy, rows, h, dbias);
}

void AccumulateColumnSums(const BFloat16* dy, int64_t rows, int64_t h,
                          float* dbias) {
  ColumnSums(dy, rows, h, dbias);
}

void AccumulateColumnSums(const Float16* dy, int64_t rows, int64_t h,
                          float* dbias) {
  ColumnSums(dy, rows, h, dbias);
}

}  // namespace internal

absl::Status BiasAdd(const Tensor& x, const Tensor& bias, Tensor* y) {
  ScopedOpTimer op_timer("BiasAdd");
  const char* op = "BiasAdd";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}, {"bias", &bias}, {"y", y}}));
  MCC_RETURN_IF_ERROR(
      CheckSameDevice(op, {{"x", &x}, {"bias", &bias}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"bias", &bias}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"y", y}));
  MCC_RETURN_IF_ERROR(internal::CheckBias(op, x, "x", bias));
  MCC_RETURN_IF_ERROR(CheckShapeMatches(op, {"x", &x}, {"y", y}));
  return BiasAddKernels()(x.device(), x, bias, y);
}

namespace {

absl::Status BiasAddCpu(const Tensor& x, const Tensor& bias, Tensor* y) {
  const int64_t h = x.size(-1);
  const int64_t rows = h == 0 ? 0 : x.numel() / h;
  std::vector<float> b32(h);
  LoadF32Any(bias, b32.data());
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(y->dtype(), [&](auto yt) {
      using TX = decltype(xt);
      using TY = decltype(yt);
      const TX* xp = x.data<TX>();
      TY* yp = y->data<TY>();
      ParallelForRows(rows, h, [&](int64_t r0, int64_t r1) {
#if defined(__AVX2__)
        // Convert in registers: each element read and written once.
        const float* bp = b32.data();
        for (int64_t r = r0; r < r1; ++r) {
          const TX* xr = xp + r * h;
          TY* yr = yp + r * h;
          int64_t j = 0;
          for (; j + 8 <= h; j += 8) {
            Store8(yr + j,
                   _mm256_add_ps(Load8(xr + j), _mm256_loadu_ps(bp + j)));
          }
          if (j < h) {
            StorePartial8(yr + j,
                          _mm256_add_ps(LoadPartial8(xr + j, h - j),
                                        LoadPartial8(bp + j, h - j)),
                          h - j);
          }
        }
#else
        float xbuf[kBlock], ybuf[kBlock];
        for (int64_t r = r0; r < r1; ++r) {
          for (int64_t j0 = 0; j0 < h; j0 += kBlock) {
            const int64_t n = std::min(kBlock, h - j0);
            const int64_t off = r * h + j0;
            const float* xf = AsF32(xp + off, n, xbuf);
            float* yf = OutF32(yp + off, ybuf);
            const float* bf = b32.data() + j0;
            for (int64_t j = 0; j < n; ++j) yf[j] = xf[j] + bf[j];
            FinishF32(yf, yp + off, n);
          }
        }
#endif
      });
    });
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status BiasAddBackward(const Tensor& dy, Tensor* dbias) {
  ScopedOpTimer op_timer("BiasAddBackward");
  const char* op = "BiasAddBackward";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"dy", &dy}, {"dbias", dbias}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"dy", &dy}, {"dbias", dbias}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"dy", &dy}));
  MCC_RETURN_IF_ERROR(CheckDType(op, {"dbias", dbias}, DType::kFloat32));
  MCC_RETURN_IF_ERROR(internal::CheckBias(op, dy, "dy", *dbias));
  return BiasAddBackwardKernels()(dy.device(), dy, dbias);
}

namespace {

absl::Status BiasAddBackwardCpu(const Tensor& dy, Tensor* dbias) {
  const int64_t h = dy.size(-1);
  const int64_t rows = h == 0 ? 0 : dy.numel() / h;
  DispatchFloat(dy.dtype(), [&](auto tag) {
    using T = decltype(tag);
    internal::AccumulateColumnSums(dy.data<T>(), rows, h, dbias->data<float>());
  });
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(BiasAddKernel, BiasAddKernels, "BiasAdd", &BiasAddCpu);
MCC_KERNEL_SLOT(BiasAddBackwardKernel, BiasAddBackwardKernels,
                "BiasAddBackward", &BiasAddBackwardCpu);

}  // namespace ops
}  // namespace mcc
