#include "core/ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "core/op_profile.h"
#include "core/ops/kernel_util.h"
#include "core/status_macros.h"

namespace mcc {
namespace ops {
namespace {

absl::Status CheckSameCount(const char* op, const char* an, const Tensor& a,
                            const char* bn, const Tensor& b) {
  if (a.numel() != b.numel()) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", an, " ", Brief(a),
                                                   " and ", bn, " ", Brief(b),
                                                   " differ in element count"));
  }
  return absl::OkStatus();
}

// Whether the bytes of a and b overlap.
bool Overlap(const Tensor& a, const Tensor& b) {
  if (!a.SharesStorageWith(b) || a.nbytes() == 0 || b.nbytes() == 0) {
    return false;
  }
  const auto pa = reinterpret_cast<uintptr_t>(a.raw_data());
  const auto pb = reinterpret_cast<uintptr_t>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// The same elements in the same dtype: an in-place operand.
bool SameElements(const Tensor& a, const Tensor& b) {
  return a.raw_data() == b.raw_data() && a.dtype() == b.dtype() &&
         a.numel() == b.numel();
}

// An operand of an elementwise op may be the output itself, or apart from it.
absl::Status CheckInPlaceOrApart(const char* op, const char* xn,
                                 const Tensor& x, const char* yn,
                                 const Tensor& y) {
  if (Overlap(x, y) && !SameElements(x, y)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", yn, " ", Brief(y), " overlaps ", xn, " ",
                     Brief(x), " without being the same elements"));
  }
  return absl::OkStatus();
}

// y[i] = f(x[i]) in fp32, block by block (y may be x).
template <typename F>
void MapUnary(const Tensor& x, Tensor* y, const F& f) {
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(y->dtype(), [&](auto yt) {
      using TX = decltype(xt);
      using TY = decltype(yt);
      const TX* xp = x.data<TX>();
      TY* yp = y->data<TY>();
      ParallelForElements(x.numel(), [&](int64_t b, int64_t e) {
        float xbuf[kBlock], ybuf[kBlock];
        for (int64_t i = b; i < e; i += kBlock) {
          const int64_t n = std::min(kBlock, e - i);
          const float* xf = AsF32(xp + i, n, xbuf);
          float* yf = OutF32(yp + i, ybuf);
          for (int64_t j = 0; j < n; ++j) yf[j] = f(xf[j]);
          FinishF32(yf, yp + i, n);
        }
      });
    });
  });
}

absl::Status ScaleCpu(const Tensor& x, float alpha, Tensor* y) {
  MapUnary(x, y, [alpha](float v) { return alpha * v; });
  return absl::OkStatus();
}

absl::Status AddCpu(const Tensor& a, const Tensor& b, Tensor* y) {
  DispatchFloat(a.dtype(), [&](auto at) {
    DispatchFloat(b.dtype(), [&](auto bt) {
      DispatchFloat(y->dtype(), [&](auto yt) {
        using TA = decltype(at);
        using TB = decltype(bt);
        using TY = decltype(yt);
        const TA* ap = a.data<TA>();
        const TB* bp = b.data<TB>();
        TY* yp = y->data<TY>();
        // One pass through registers: a 16-bit operand is widened and the
        // 16-bit result rounded in place (the same fp32 sum and rounding as
        // converting through fp32 buffers, without their three extra passes).
        constexpr Lanes16 L = kLanes16For<TA, TB, TY>;
        ParallelForElements(a.numel(), [&](int64_t s, int64_t e) {
          for (int64_t i = s; i < e; i += 16) {
            const int64_t n = std::min<int64_t>(16, e - i);
            __m256 alo, ahi, blo, bhi;
            LoadUpTo16<L>(ap + i, n, &alo, &ahi);
            LoadUpTo16<L>(bp + i, n, &blo, &bhi);
            StoreUpTo16<L>(yp + i, _mm256_add_ps(alo, blo),
                           _mm256_add_ps(ahi, bhi), n);
          }
        });
      });
    });
  });
  return absl::OkStatus();
}

absl::Status AccumulateCpu(const Tensor& x, float alpha, Tensor* y) {
  DispatchFloat(x.dtype(), [&](auto xt) {
    DispatchFloat(y->dtype(), [&](auto yt) {
      using TX = decltype(xt);
      using TY = decltype(yt);
      const TX* xp = x.data<TX>();
      TY* yp = y->data<TY>();
      ParallelForElements(x.numel(), [&](int64_t b, int64_t e) {
        float xbuf[kBlock], ybuf[kBlock];
        for (int64_t i = b; i < e; i += kBlock) {
          const int64_t n = std::min(kBlock, e - i);
          const float* xf = AsF32(xp + i, n, xbuf);
          float* yf = ybuf;
          LoadF32(yp + i, yf, n);
          for (int64_t j = 0; j < n; ++j) yf[j] = std::fma(alpha, xf[j], yf[j]);
          StoreF32(yf, yp + i, n);
        }
      });
    });
  });
  return absl::OkStatus();
}

}  // namespace

MCC_KERNEL_SLOT(ScaleKernel, ScaleKernels, "Scale", &ScaleCpu);
MCC_KERNEL_SLOT(AddKernel, AddKernels, "Add", &AddCpu);
MCC_KERNEL_SLOT(AccumulateKernel, AccumulateKernels, "Accumulate",
                &AccumulateCpu);

absl::Status Fill(double value, Tensor* x) {
  ScopedOpTimer op_timer("Fill");
  MCC_RETURN_IF_ERROR(CheckDefined("Fill", {{"x", x}}));
  return FillKernels()(x->device(), value, x);
}

absl::Status Convert(const Tensor& src, Tensor* dst) {
  ScopedOpTimer op_timer("Convert");
  const char* op = "Convert";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"src", &src}, {"dst", dst}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"src", &src}, {"dst", dst}}));
  MCC_RETURN_IF_ERROR(CheckSameCount(op, "src", src, "dst", *dst));
  MCC_RETURN_IF_ERROR(CheckInPlaceOrApart(op, "src", src, "dst", *dst));
  if (SameElements(src, *dst)) return absl::OkStatus();
  return ConvertKernels()(src.device(), src, dst);
}

absl::Status Scale(const Tensor& x, float alpha, Tensor* y) {
  ScopedOpTimer op_timer("Scale");
  const char* op = "Scale";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", &x}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"y", y}));
  MCC_RETURN_IF_ERROR(CheckSameCount(op, "x", x, "y", *y));
  MCC_RETURN_IF_ERROR(CheckInPlaceOrApart(op, "x", x, "y", *y));
  return ScaleKernels()(x.device(), x, alpha, y);
}

absl::Status Add(const Tensor& a, const Tensor& b, Tensor* y) {
  ScopedOpTimer op_timer("Add");
  const char* op = "Add";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"a", &a}, {"b", &b}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"a", &a}, {"b", &b}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"a", &a}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"b", &b}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"y", y}));
  MCC_RETURN_IF_ERROR(CheckSameCount(op, "a", a, "b", b));
  MCC_RETURN_IF_ERROR(CheckSameCount(op, "a", a, "y", *y));
  MCC_RETURN_IF_ERROR(CheckInPlaceOrApart(op, "a", a, "y", *y));
  MCC_RETURN_IF_ERROR(CheckInPlaceOrApart(op, "b", b, "y", *y));
  return AddKernels()(a.device(), a, b, y);
}

absl::Status Accumulate(const Tensor& x, float alpha, Tensor* y) {
  ScopedOpTimer op_timer("Accumulate");
  const char* op = "Accumulate";
  MCC_RETURN_IF_ERROR(CheckDefined(op, {{"x", &x}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckSameDevice(op, {{"x", &x}, {"y", y}}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"x", &x}));
  MCC_RETURN_IF_ERROR(CheckFloatDType(op, {"y", y}));
  MCC_RETURN_IF_ERROR(CheckSameCount(op, "x", x, "y", *y));
  if (Overlap(x, *y)) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": y ", Brief(*y), " overlaps x ", Brief(x)));
  }
  return AccumulateKernels()(x.device(), x, alpha, y);
}

}  // namespace ops
}  // namespace mcc
