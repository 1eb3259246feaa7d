#include "core/ops/kernel_util.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/thread_pool.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace mcc {
namespace ops {

std::string Brief(const Tensor& t) {
  if (!t.defined()) return "undefined tensor";
  std::string s = absl::StrCat(DTypeName(t.dtype()), t.ShapeString());
  if (!t.device().is_cpu()) absl::StrAppend(&s, " on ", t.device().ToString());
  return s;
}

absl::Status CheckDefined(absl::string_view op,
                          std::initializer_list<Arg> args) {
  for (const Arg& a : args) {
    if (a.tensor == nullptr || !a.tensor->defined()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", a.name, " is undefined (null or empty tensor)"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSameDevice(absl::string_view op,
                             std::initializer_list<Arg> args) {
  const Arg* first = args.begin();
  for (const Arg& a : args) {
    if (a.tensor->device() != first->tensor->device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op, ": ", first->name, " ", first->tensor->Describe(), " and ",
          a.name, " ", a.tensor->Describe(), " are on different devices"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFloatDType(absl::string_view op, const Arg& a) {
  const DType d = a.tensor->dtype();
  if (d != DType::kFloat32 && d != DType::kBFloat16 && d != DType::kFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", a.name, " ", Brief(*a.tensor),
                     " must be fp32, bf16 or fp16"));
  }
  return absl::OkStatus();
}

absl::Status CheckOne16BitType(absl::string_view op,
                               std::initializer_list<Arg> args) {
  const Arg* bf16 = nullptr;
  const Arg* fp16 = nullptr;
  for (const Arg& a : args) {
    if (a.tensor == nullptr || !a.tensor->defined()) continue;
    if (a.tensor->dtype() == DType::kBFloat16 && bf16 == nullptr) bf16 = &a;
    if (a.tensor->dtype() == DType::kFloat16 && fp16 == nullptr) fp16 = &a;
  }
  if (bf16 != nullptr && fp16 != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": ", bf16->name, " ", Brief(*bf16->tensor), " and ", fp16->name,
        " ", Brief(*fp16->tensor), ": bf16 and fp16 cannot be mixed"));
  }
  return absl::OkStatus();
}

absl::Status CheckDType(absl::string_view op, const Arg& a, DType dtype) {
  if (a.tensor->dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", a.name, " ", Brief(*a.tensor), " must be ",
                     DTypeName(dtype)));
  }
  return absl::OkStatus();
}

absl::Status CheckShapeMatches(absl::string_view op, const Arg& ref,
                               const Arg& a) {
  if (a.tensor->shape() != ref.tensor->shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", ref.name, " ", Brief(*ref.tensor), " and ",
                     a.name, " ", Brief(*a.tensor), ": shapes differ"));
  }
  return absl::OkStatus();
}

void BF16ToF32(const BFloat16* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
#endif
  for (; i < n; ++i) dst[i] = BFloat16ToFloat(src[i]);
}

void F32ToBF16(const float* src, BFloat16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  const __m256i ones = _mm256_set1_epi32(1);
  const __m256i bias = _mm256_set1_epi32(0x7fff);
  const __m256i qnan = _mm256_set1_epi32(0x0040);
  for (; i + 16 <= n; i += 16) {
    __m256i out[2];
    for (int h = 0; h < 2; ++h) {
      const __m256 f = _mm256_loadu_ps(src + i + 8 * h);
      const __m256i u = _mm256_castps_si256(f);
      // Round to nearest even: u + 0x7fff + ((u >> 16) & 1).
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), ones);
      const __m256i rounded = _mm256_srli_epi32(
          _mm256_add_epi32(u, _mm256_add_epi32(bias, lsb)), 16);
      // NaN: truncate and set the quiet bit.
      const __m256i nan_bits = _mm256_or_si256(_mm256_srli_epi32(u, 16), qnan);
      const __m256 is_nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
      out[h] =
          _mm256_blendv_epi8(rounded, nan_bits, _mm256_castps_si256(is_nan));
    }
    // Pack the 32-bit lanes (values < 2^16) to 16 bits, fixing lane order.
    const __m256i packed =
        _mm256_permute4x64_epi64(_mm256_packus_epi32(out[0], out[1]), 0xd8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
#endif
  for (; i < n; ++i) dst[i] = FloatToBFloat16(src[i]);
}

void F16ToF32(const Float16* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = Float16ToFloat(src[i]);
}

void F32ToF16(const float* src, Float16* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h =
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = FloatToFloat16(src[i]);
}

void ParallelForElements(int64_t n,
                         const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  ThreadPool& pool = ThreadPool::Global();
  if (n <= kGrain || pool.num_threads() == 1) {
    fn(0, n);
    return;
  }
  // Chunk in whole blocks so every chunk but the last is block-aligned.
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  pool.ParallelFor(blocks, kGrain / kBlock, [&](int64_t b0, int64_t b1) {
    fn(b0 * kBlock, std::min(n, b1 * kBlock));
  });
}

void LoadF32Any(const Tensor& t, float* dst) {
  if (t.dtype() == DType::kFloat32) {
    const float* src = t.data<float>();
    ParallelForElements(t.numel(), [&](int64_t b, int64_t e) {
      std::memcpy(dst + b, src + b, (e - b) * sizeof(float));
    });
  } else if (t.dtype() == DType::kFloat16) {
    const Float16* src = t.data<Float16>();
    ParallelForElements(t.numel(), [&](int64_t b, int64_t e) {
      F16ToF32(src + b, dst + b, e - b);
    });
  } else {
    const BFloat16* src = t.data<BFloat16>();
    ParallelForElements(t.numel(), [&](int64_t b, int64_t e) {
      BF16ToF32(src + b, dst + b, e - b);
    });
  }
}

void ParallelForRows(int64_t rows, int64_t cols,
                     const std::function<void(int64_t, int64_t)>& fn) {
  if (rows <= 0) return;
  const int64_t grain =
      std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cols));
  ThreadPool::Global().ParallelFor(rows, grain, fn);
}

}  // namespace ops
}  // namespace mcc
