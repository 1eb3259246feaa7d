#include "parallel/init.h"

#include <cmath>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "core/ops/dropout.h"
#include "core/status_macros.h"

namespace mcc {
namespace parallel {
namespace {

// FNV-1a: a stable hash of the name (absl::Hash is salted per process).
uint64_t StableHash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Standard normal numbers for full-tensor elements [first, first + n).
void NormalRange(uint64_t key, int64_t first, int64_t n, float std,
                 float* out) {
  std::vector<uint32_t> words(2 * n);
  ops::PhiloxStream(key, 2 * static_cast<uint64_t>(first), 2 * n, words.data());
  for (int64_t i = 0; i < n; ++i) {
    // Box-Muller on two uniforms in (0, 1].
    const double u1 = (words[2 * i] + 1.0) / 4294967296.0;
    const double u2 = words[2 * i + 1] / 4294967296.0;
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
    out[i] = static_cast<float>(z * std);
  }
}

}  // namespace

absl::StatusOr<Tensor> InitShard(const std::string& name, uint64_t seed,
                                 const InitSpec& spec,
                                 const Shape& global_shape, int partition_dim,
                                 int rank, int count, DType dtype,
                                 Device device) {
  Shape local = global_shape;
  if (partition_dim >= 0) {
    if (partition_dim >= static_cast<int>(global_shape.size()) || count <= 0 ||
        global_shape[partition_dim] % count != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", name, ": dimension ", partition_dim,
                       " of ", ShapeToString(global_shape),
                       " does not split into ", count, " equal pieces"));
    }
    local[partition_dim] /= count;
  }
  Tensor f32 = Tensor::Empty(local, DType::kFloat32);
  float* p = f32.data<float>();
  if (spec.kind != InitSpec::Kind::kNormal) {
    f32.Fill(spec.kind == InitSpec::Kind::kOnes ? 1.0 : 0.0);
  } else {
    const uint64_t key = seed * 0x9E3779B97F4A7C15ull ^ StableHash(name);
    if (partition_dim < 0) {
      NormalRange(key, 0, f32.numel(), spec.std, p);
    } else {
      // The full tensor as [outer, split, inner]: the local piece is, for
      // each outer index, one contiguous run of split/count * inner elements.
      int64_t outer = 1, inner = 1;
      for (int d = 0; d < partition_dim; ++d) outer *= global_shape[d];
      for (size_t d = partition_dim + 1; d < global_shape.size(); ++d) {
        inner *= global_shape[d];
      }
      const int64_t split = global_shape[partition_dim];
      const int64_t run = split / count * inner;
      for (int64_t o = 0; o < outer; ++o) {
        const int64_t first = o * split * inner + rank * run;
        NormalRange(key, first, run, spec.std, p + o * run);
      }
    }
  }
  Tensor host = f32;
  if (dtype != DType::kFloat32) {
    MCC_ASSIGN_OR_RETURN(host, f32.To(dtype));
  }
  if (device.is_cpu()) return host;
  // The device's copy hook: the only way initial values reach it.
  return host.To(device);
}

}  // namespace parallel
}  // namespace mcc
