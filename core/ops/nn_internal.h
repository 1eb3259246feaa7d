#ifndef CORE_OPS_NN_INTERNAL_H_
#define CORE_OPS_NN_INTERNAL_H_

// Internal pieces shared by the transformer kernels (norms, rotary, attention,
// cross entropy): AVX2 loads and stores of fp32/bf16/fp16 as fp32 vectors, a
// vector exp, horizontal reductions, dtype dispatch and argument checks.
// Not part of the public API.

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/half.h"
#include "core/ops/kernel_util.h"
#include "core/tensor.h"

namespace mcc {
namespace ops {
namespace nn {

// ---- Scalar and 8-wide loads/stores, fp32 in registers. ----

inline float LoadS(const float* p) { return *p; }
inline float LoadS(const BFloat16* p) { return BFloat16ToFloat(*p); }
inline void StoreS(float* p, float v) { *p = v; }
inline void StoreS(BFloat16* p, float v) { *p = FloatToBFloat16(v); }
inline float LoadS(const Float16* p) { return Float16ToFloat(*p); }
inline void StoreS(Float16* p, float v) { *p = FloatToFloat16(v); }

// 8 elements to and from fp32 registers: kernel_util.h's.
using ops::Load8;
using ops::Store8;

// n elements of src (fp32, bf16 or fp16) to fp32, optionally scaled.
template <typename T>
inline void ToF32(const T* src, float* dst, int64_t n, float scale = 1.0f) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_mul_ps(Load8(src + i), s));
  }
  for (; i < n; ++i) dst[i] = LoadS(src + i) * scale;
}

// n fp32 elements to dst (fp32, bf16 or fp16), optionally scaled.
template <typename T>
inline void FromF32(const float* src, T* dst, int64_t n, float scale = 1.0f) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Store8(dst + i, _mm256_mul_ps(_mm256_loadu_ps(src + i), s));
  }
  for (; i < n; ++i) StoreS(dst + i, src[i] * scale);
}

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) on 8 lanes: kernel_util's Exp8 (Cephes' polynomial, about 2 ulp
// for x in [-87.3, 88.7]; inputs below are clamped, so the result is then
// ~1e-38, not 0, -inf included).
using ::mcc::ops::Exp8;

inline float ExpS(float x) {
  alignas(32) float v[8] = {x};
  _mm256_store_ps(v, Exp8(_mm256_load_ps(v)));
  return v[0];
}

// Calls f(float{}), f(BFloat16{}) or f(Float16{}) for a floating dtype
// checked beforehand.
template <typename F>
inline decltype(auto) DispatchFloat(DType dtype, F&& f) {
  if (dtype == DType::kBFloat16) return f(BFloat16{});
  if (dtype == DType::kFloat16) return f(Float16{});
  return f(float{});
}

// ---- Argument checks. Messages name the op, the tensor and its shape. ----

inline std::string Desc(const Tensor& t) {
  return t.defined() ? t.Describe() : "undefined tensor";
}

inline absl::Status Defined(absl::string_view op, const char* name,
                            const Tensor* t) {
  if (t == nullptr || !t->defined()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " is ", t == nullptr ? "null" : "undefined"));
  }
  return absl::OkStatus();
}

inline absl::Status IsFloat(absl::string_view op, const char* name,
                            const Tensor& t) {
  if (t.dtype() != DType::kFloat32 && t.dtype() != DType::kBFloat16 &&
      t.dtype() != DType::kFloat16) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " must be fp32, bf16 or fp16, got ", t.Describe()));
  }
  return absl::OkStatus();
}

inline absl::Status IsF32(absl::string_view op, const char* name,
                          const Tensor& t) {
  if (t.dtype() != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", name, " must be fp32, got ", t.Describe()));
  }
  return absl::OkStatus();
}

inline absl::Status SameShape(absl::string_view op, const char* ref_name,
                              const Tensor& ref, const char* name,
                              const Tensor& t) {
  if (ref.shape() != t.shape()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " ", t.Describe(), " must have the shape of ", ref_name,
        " ", ref.Describe()));
  }
  return absl::OkStatus();
}

inline absl::Status SameDevice(absl::string_view op, const char* ref_name,
                               const Tensor& ref, const char* name,
                               const Tensor& t) {
  if (ref.device() != t.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", name, " ", t.Describe(), " is not on the device of ",
        ref_name, " ", ref.Describe()));
  }
  return absl::OkStatus();
}

}  // namespace nn
}  // namespace ops
}  // namespace mcc

#endif  // CORE_OPS_NN_INTERNAL_H_
