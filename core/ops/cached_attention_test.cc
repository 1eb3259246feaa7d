#include "core/ops/cached_attention.h"

#include <cmath>
#include <vector>

#include "core/ops/test_util.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectAllNear;
using testing::ExpectSameOnTestDevice;
using testing::RandomTensor;

// float64 softmax attention of query i (at position + i) over cached keys
// 0 .. position + i.
std::vector<double> Reference(const Tensor& q, const Tensor& k, const Tensor& v,
                              int64_t position) {
  const int64_t b = q.size(0), n = q.size(1), heads = q.size(2), d = q.size(3);
  const int64_t cap = k.size(1), groups = k.size(2);
  const std::vector<double> qv = q.ToDoubles(), kv = k.ToDoubles(),
                            vv = v.ToDoubles();
  std::vector<double> out(q.numel());
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / (heads / groups);
        const int64_t keys = position + i + 1;
        std::vector<double> s(keys);
        double mx = -1e300, z = 0;
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) {
            dot += qv[((bi * n + i) * heads + h) * d + e] *
                   kv[((bi * cap + j) * groups + g) * d + e];
          }
          s[j] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, s[j]);
        }
        for (double& x : s) z += (x = std::exp(x - mx));
        for (int64_t e = 0; e < d; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < keys; ++j) {
            acc += s[j] / z * vv[((bi * cap + j) * groups + g) * d + e];
          }
          out[((bi * n + i) * heads + h) * d + e] = acc;
        }
      }
    }
  }
  return out;
}

TEST(CachedAttentionTest, MatchesFloat64AndTheTestDevice) {
  const int64_t b = 2, cap = 9, groups = 2, heads = 4, d = 8;
  Tensor k = RandomTensor({b, cap, groups, d}, DType::kFloat32, 1);
  Tensor v = RandomTensor({b, cap, groups, d}, DType::kFloat32, 2);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t position : {0, 3, 8}) {
      const int64_t n = position == 8 ? 1 : 3;
      Tensor q = RandomTensor({b, n, heads, d}, dtype, 3);
      Tensor out = Tensor::Zeros(q.shape(), dtype);
      auto res = ExpectSameOnTestDevice(
          {q, k, v, out}, [position](std::vector<Tensor>& t) {
            return CachedAttention(t[0], t[1], t[2], position, &t[3]);
          });
      // fp32 sums of at most 9 terms; 16-bit outputs round once.
      const double tol = dtype == DType::kFloat32 ? 1e-5 : 1e-2;
      ExpectAllNear(res[3].ToDoubles(), Reference(q, k, v, position), tol, tol,
                    "cached attention");
    }
  }
}

TEST(CachedAttentionTest, RefusesQueriesPastTheCache) {
  Tensor k = Tensor::Zeros({1, 4, 1, 8}, DType::kFloat32);
  Tensor q = Tensor::Zeros({1, 2, 2, 8}, DType::kFloat32);
  Tensor out = Tensor::Zeros(q.shape(), DType::kFloat32);
  const absl::Status s = CachedAttention(q, k, k, 3, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("do not fit the cache"), std::string::npos) << s;
}

}  // namespace
}  // namespace ops
}  // namespace mcc
