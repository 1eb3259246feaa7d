#ifndef CHECKPOINT_TEST_UTIL_H_
#define CHECKPOINT_TEST_UTIL_H_

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/file_util.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "glog/logging.h"

namespace mcc {
namespace testing_util {

// A fresh, empty directory under the test's temporary directory.
inline std::string FreshDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir =
      file_util::JoinPath(base ? base : "/tmp", absl::StrCat("ckpt_", name));
  MCC_CHECK_OK(file_util::RemoveAll(dir));
  MCC_CHECK_OK(file_util::MakeDirs(dir));
  return dir;
}

// Deterministic pseudo-random values (exact in every dtype: small integers
// divided by 8 for floats).
inline Tensor RandomTensor(Shape shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(NumElements(shape));
  for (auto& x : v)
    x = static_cast<float>(static_cast<int>(rng() % 2001) - 1000);
  if (IsFloatingPoint(dtype)) {
    for (auto& x : v) x /= 8.0f;
  }
  auto t = Tensor::FromVector(v, shape, dtype);
  CHECK(t.ok()) << t.status();
  return *t;
}

// The [begin, begin + len) slice along dimension dim of a CPU tensor (a copy).
inline Tensor SliceDim(const Tensor& t, int dim, int64_t begin, int64_t len) {
  Shape shape = t.shape();
  shape[dim] = len;
  Tensor out = Tensor::Empty(shape, t.dtype());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= t.shape()[d];
  for (int d = dim + 1; d < t.dim(); ++d) inner *= t.shape()[d];
  const size_t es = DTypeSize(t.dtype());
  const char* src = static_cast<const char*>(t.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(dst + o * len * inner * es,
                src + (o * t.shape()[dim] + begin) * inner * es,
                len * inner * es);
  }
  return out;
}

}  // namespace testing_util
}  // namespace mcc

#endif  // CHECKPOINT_TEST_UTIL_H_
