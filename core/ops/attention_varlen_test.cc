// Flash attention with packed documents and sliding windows
// (AttentionOptions::first_key) against a float64 reference that applies
// the per-document causal (and window) mask key by key.

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/nn_test_util.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"

namespace mcc {
namespace ops {
namespace {

using testing::ExpectClose;
using testing::FromDoubles;
using testing::RandomDoubles;

struct Problem {
  int64_t b, s, hq, hkv, d;
  bool causal = true;
  // first[bi * s + i]: query i's first visible key.
  std::vector<int32_t> first;
};

int64_t Idx(const Problem& p, int64_t heads, int64_t bi, int64_t t, int64_t h,
            int64_t x) {
  return ((bi * p.s + t) * heads + h) * p.d + x;
}

// Key j visible to query i of batch entry bi: the mask the reference builds.
bool Sees(const Problem& p, int64_t bi, int64_t i, int64_t j) {
  if (p.causal && j > i) return false;
  return j >= p.first[bi * p.s + i];
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Masked softmax attention and its analytic backward in float64. A row with
// no visible key gives out 0, lse -inf and no gradient.
Reference Attend(const Problem& p, const std::vector<double>& q,
                 const std::vector<double>& k, const std::vector<double>& v,
                 const std::vector<double>& dout) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(p.d));
  Reference r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  r.lse.assign(p.b * p.hq * p.s, -std::numeric_limits<double>::infinity());
  std::vector<double> w(p.s), dp(p.s);
  for (int64_t bi = 0; bi < p.b; ++bi) {
    for (int64_t h = 0; h < p.hq; ++h) {
      const int64_t kvh = h / (p.hq / p.hkv);
      for (int64_t i = 0; i < p.s; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < p.s; ++j) {
          if (!Sees(p, bi, i, j)) continue;
          double dot = 0.0;
          for (int64_t x = 0; x < p.d; ++x) {
            dot +=
                q[Idx(p, p.hq, bi, i, h, x)] * k[Idx(p, p.hkv, bi, j, kvh, x)];
          }
          w[j] = dot * scale;
          mx = std::max(mx, w[j]);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;
        double sum = 0.0;
        for (int64_t j = 0; j < p.s; ++j) {
          if (Sees(p, bi, i, j)) sum += std::exp(w[j] - mx);
        }
        r.lse[(bi * p.hq + h) * p.s + i] = mx + std::log(sum);
        double pdp = 0.0;
        for (int64_t j = 0; j < p.s; ++j) {
          if (!Sees(p, bi, i, j)) continue;
          w[j] = std::exp(w[j] - mx) / sum;
          double g = 0.0;
          for (int64_t x = 0; x < p.d; ++x) {
            r.out[Idx(p, p.hq, bi, i, h, x)] +=
                w[j] * v[Idx(p, p.hkv, bi, j, kvh, x)];
            g += dout[Idx(p, p.hq, bi, i, h, x)] *
                 v[Idx(p, p.hkv, bi, j, kvh, x)];
          }
          dp[j] = g;
          pdp += w[j] * g;
        }
        for (int64_t j = 0; j < p.s; ++j) {
          if (!Sees(p, bi, i, j)) continue;
          const double ds = w[j] * (dp[j] - pdp) * scale;
          for (int64_t x = 0; x < p.d; ++x) {
            r.dv[Idx(p, p.hkv, bi, j, kvh, x)] +=
                w[j] * dout[Idx(p, p.hq, bi, i, h, x)];
            r.dq[Idx(p, p.hq, bi, i, h, x)] +=
                ds * k[Idx(p, p.hkv, bi, j, kvh, x)];
            r.dk[Idx(p, p.hkv, bi, j, kvh, x)] +=
                ds * q[Idx(p, p.hq, bi, i, h, x)];
          }
        }
      }
    }
  }
  return r;
}

// First keys of packed documents of the given lengths (summing to s) with
// an optional window of `window` keys (0: none).
std::vector<int32_t> DocumentFirstKeys(const std::vector<int64_t>& lengths,
                                       int64_t window) {
  std::vector<int32_t> first;
  int64_t start = 0;
  for (int64_t n : lengths) {
    for (int64_t t = 0; t < n; ++t) {
      int64_t f = start;
      if (window > 0) f = std::max<int64_t>(f, start + t - window + 1);
      first.push_back(static_cast<int32_t>(f));
    }
    start += n;
  }
  return first;
}

void Check(const Problem& p, uint32_t seed) {
  const int64_t nq = p.b * p.s * p.hq * p.d, nk = p.b * p.s * p.hkv * p.d;
  const auto q = RandomDoubles(nq, seed, -2, 2);
  const auto k = RandomDoubles(nk, seed + 1, -2, 2);
  const auto v = RandomDoubles(nk, seed + 2);
  const auto dout = RandomDoubles(nq, seed + 3);
  Reference want = Attend(p, q, k, v, dout);

  const Shape qs{p.b, p.s, p.hq, p.d}, ks{p.b, p.s, p.hkv, p.d};
  Tensor tq = FromDoubles(q, qs, DType::kFloat32);
  Tensor tk = FromDoubles(k, ks, DType::kFloat32);
  Tensor tv = FromDoubles(v, ks, DType::kFloat32);
  Tensor tdout = FromDoubles(dout, qs, DType::kFloat32);
  AttentionOptions options;
  options.causal = p.causal;
  std::vector<int64_t> first64(p.first.begin(), p.first.end());
  options.first_key =
      Tensor::FromInts(first64, {p.b, p.s}, DType::kInt32).value();
  Tensor out = Tensor::Empty(qs, DType::kFloat32);
  Tensor lse = Tensor::Empty({p.b, p.hq, p.s}, DType::kFloat32);
  ASSERT_TRUE(FlashAttentionForward(tq, tk, tv, options, &out, &lse).ok());
  ExpectClose(out.ToDoubles(), want.out, 1e-5, 1e-5, "out");
  std::vector<double> got_lse = lse.ToDoubles();
  for (size_t i = 0; i < got_lse.size(); ++i) {
    if (std::isinf(want.lse[i])) {
      EXPECT_TRUE(std::isinf(got_lse[i]) && got_lse[i] < 0) << "lse " << i;
      got_lse[i] = want.lse[i] = 0.0;
    }
  }
  ExpectClose(got_lse, want.lse, 1e-5, 1e-5, "lse");
  Tensor dq = Tensor::Empty(qs, DType::kFloat32);
  Tensor dk = Tensor::Empty(ks, DType::kFloat32);
  Tensor dv = Tensor::Empty(ks, DType::kFloat32);
  ASSERT_TRUE(FlashAttentionBackward(tq, tk, tv, out, tdout, lse, options, &dq,
                                     &dk, &dv)
                  .ok());
  ExpectClose(dq.ToDoubles(), want.dq, 2e-5, 1e-4, "dq");
  ExpectClose(dk.ToDoubles(), want.dk, 2e-5, 1e-4, "dk");
  ExpectClose(dv.ToDoubles(), want.dv, 2e-5, 1e-4, "dv");
}

std::vector<int32_t> Repeat(const std::vector<int32_t>& one, int64_t b) {
  std::vector<int32_t> all;
  for (int64_t i = 0; i < b; ++i) all.insert(all.end(), one.begin(), one.end());
  return all;
}

TEST(AttentionVarlenTest, PackedDocumentsMatchMaskedReference) {
  // Boundaries inside blocks (64 rows), a one-token document and a document
  // spanning blocks; GQA; two batch entries with different packings.
  Problem p{2, 200, 4, 2, 16};
  p.first = DocumentFirstKeys({70, 1, 57, 72}, 0);
  const auto second = DocumentFirstKeys({5, 130, 65}, 0);
  p.first.insert(p.first.end(), second.begin(), second.end());
  Check(p, 11);
}

TEST(AttentionVarlenTest, SlidingWindowMatchesMaskedReference) {
  for (int64_t window : {1, 17, 64, 100, 199}) {
    SCOPED_TRACE(window);
    Problem p{1, 199, 2, 1, 8};
    p.first = DocumentFirstKeys({199}, window);
    Check(p, 21 + static_cast<uint32_t>(window));
  }
}

TEST(AttentionVarlenTest, WindowInsidePackedDocuments) {
  Problem p{2, 160, 2, 2, 20};  // head_dim not a multiple of 8
  p.first = Repeat(DocumentFirstKeys({90, 3, 67}, 33), 2);
  Check(p, 31);
}

TEST(AttentionVarlenTest, RowsThatSeeNoKeyGiveZeroAndMinusInfinity) {
  // A context-parallel ring step: keys of another chunk, not causal, and
  // first keys in that chunk's coordinates (some before it, some past it).
  Problem p{1, 96, 2, 1, 8};
  p.causal = false;
  for (int64_t i = 0; i < p.s; ++i) {
    p.first.push_back(static_cast<int32_t>(i < 30 ? -40 : i < 60 ? 50 : 500));
  }
  Check(p, 41);
}

TEST(AttentionVarlenTest, EachDocumentAsIfAlone) {
  // Three packed documents give each document what it gets run alone.
  const std::vector<int64_t> lengths = {50, 93, 77};
  const int64_t s = 220, h = 2, d = 16;
  const auto q = RandomDoubles(s * h * d, 51), k = RandomDoubles(s * h * d, 52),
             v = RandomDoubles(s * h * d, 53);
  AttentionOptions packed;
  packed.first_key = Tensor::Empty({1, s}, DType::kInt32);
  const auto first = DocumentFirstKeys(lengths, 0);
  std::copy(first.begin(), first.end(), packed.first_key.data<int32_t>());
  Tensor out = Tensor::Empty({1, s, h, d}, DType::kFloat32);
  Tensor lse = Tensor::Empty({1, h, s}, DType::kFloat32);
  ASSERT_TRUE(
      FlashAttentionForward(FromDoubles(q, {1, s, h, d}, DType::kFloat32),
                            FromDoubles(k, {1, s, h, d}, DType::kFloat32),
                            FromDoubles(v, {1, s, h, d}, DType::kFloat32),
                            packed, &out, &lse)
          .ok());
  const std::vector<double> all = out.ToDoubles();
  int64_t start = 0;
  for (int64_t n : lengths) {
    auto part = [&](const std::vector<double>& x) {
      return std::vector<double>(x.begin() + start * h * d,
                                 x.begin() + (start + n) * h * d);
    };
    Tensor alone = Tensor::Empty({1, n, h, d}, DType::kFloat32);
    Tensor alone_lse = Tensor::Empty({1, h, n}, DType::kFloat32);
    ASSERT_TRUE(FlashAttentionForward(
                    FromDoubles(part(q), {1, n, h, d}, DType::kFloat32),
                    FromDoubles(part(k), {1, n, h, d}, DType::kFloat32),
                    FromDoubles(part(v), {1, n, h, d}, DType::kFloat32), {},
                    &alone, &alone_lse)
                    .ok());
    ExpectClose(part(all), alone.ToDoubles(), 1e-6, 1e-6, "document");
    start += n;
  }
}

TEST(AttentionVarlenTest, DropoutWithUnlimitedFirstKeysIsUnchanged) {
  // first_key 0 everywhere hides nothing: the same masks and bits as
  // without it, so the document path keeps the dropout stream's numbering.
  const int64_t b = 1, s = 130, h = 2, d = 8;
  Tensor q = FromDoubles(RandomDoubles(b * s * h * d, 61), {b, s, h, d},
                         DType::kFloat32);
  Tensor k = FromDoubles(RandomDoubles(b * s * h * d, 62), {b, s, h, d},
                         DType::kFloat32);
  AttentionOptions plain;
  plain.dropout_p = 0.3f;
  plain.dropout_seed = 7;
  AttentionOptions with = plain;
  with.first_key = Tensor::Full({b, s}, 0.0, DType::kInt32);
  Tensor o1 = Tensor::Empty({b, s, h, d}, DType::kFloat32),
         o2 = Tensor::Empty({b, s, h, d}, DType::kFloat32);
  Tensor l1 = Tensor::Empty({b, h, s}, DType::kFloat32),
         l2 = Tensor::Empty({b, h, s}, DType::kFloat32);
  ASSERT_TRUE(FlashAttentionForward(q, k, k, plain, &o1, &l1).ok());
  ASSERT_TRUE(FlashAttentionForward(q, k, k, with, &o2, &l2).ok());
  EXPECT_EQ(o1.ToDoubles(), o2.ToDoubles());
  Tensor g1[3], g2[3];
  for (int i = 0; i < 3; ++i) {
    g1[i] = Tensor::Empty({b, s, h, d}, DType::kFloat32);
    g2[i] = Tensor::Empty({b, s, h, d}, DType::kFloat32);
  }
  ASSERT_TRUE(
      FlashAttentionBackward(q, k, k, o1, q, l1, plain, &g1[0], &g1[1], &g1[2])
          .ok());
  ASSERT_TRUE(
      FlashAttentionBackward(q, k, k, o2, q, l2, with, &g2[0], &g2[1], &g2[2])
          .ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(g1[i].ToDoubles(), g2[i].ToDoubles());
}

// first_key may live on q's device (the inference engine uploads it once
// for all its layers): the same bytes as the CPU run, forward and
// backward, with no copy between the device and the host; on a device
// other than q's and the host it is refused.
TEST(AttentionVarlenTest, FirstKeyOnQsDevice) {
  const int64_t b = 2, s = 9, h = 2, d = 8;
  const Shape qs{b, s, h, d};
  std::vector<int64_t> first;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < s; ++i) first.push_back(i < 4 ? 0 : 4 + bi);
  }
  const Tensor first_key = *Tensor::FromInts(first, {b, s}, DType::kInt32);
  std::vector<Tensor> args = {testing::RandomTensor(qs, DType::kFloat32, 1),
                              testing::RandomTensor(qs, DType::kFloat32, 2),
                              testing::RandomTensor(qs, DType::kFloat32, 3),
                              Tensor::Full(qs, 0.0, DType::kFloat32),
                              Tensor::Full({b, h, s}, 0.0, DType::kFloat32),
                              first_key,
                              testing::RandomTensor(qs, DType::kFloat32, 4),
                              Tensor::Full(qs, 0.0, DType::kFloat32),
                              Tensor::Full(qs, 0.0, DType::kFloat32),
                              Tensor::Full(qs, 0.0, DType::kFloat32)};
  testing::ExpectSameOnTestDevice(args, [](std::vector<Tensor>& t) {
    AttentionOptions options;
    options.first_key = t[5];
    MCC_RETURN_IF_ERROR(
        FlashAttentionForward(t[0], t[1], t[2], options, &t[3], &t[4]));
    return FlashAttentionBackward(t[0], t[1], t[2], t[3], t[6], t[4], options,
                                  &t[7], &t[8], &t[9]);
  });

  Tensor q = Tensor::Full(qs, 0.5, DType::kFloat32);
  Tensor out = Tensor::Empty(qs, DType::kFloat32);
  Tensor lse = Tensor::Empty({b, h, s}, DType::kFloat32);
  AttentionOptions options;
  options.first_key = *first_key.To(Device::TestDevice());
  const absl::Status st = FlashAttentionForward(q, q, q, options, &out, &lse);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("first_key"), absl::string_view::npos) << st;
}

TEST(AttentionVarlenTest, BadFirstKeyIsRefusedByName) {
  Tensor q = Tensor::Full({1, 8, 1, 8}, 0.5, DType::kFloat32);
  Tensor out = Tensor::Empty(q.shape(), DType::kFloat32);
  Tensor lse = Tensor::Empty({1, 1, 8}, DType::kFloat32);
  AttentionOptions options;
  for (Tensor bad : {Tensor::Full({1, 7}, 0.0, DType::kInt32),
                     Tensor::Full({1, 8}, 0.0, DType::kInt64)}) {
    options.first_key = bad;
    const absl::Status st = FlashAttentionForward(q, q, q, options, &out, &lse);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("first_key"), absl::string_view::npos) << st;
  }
}

}  // namespace
}  // namespace ops
}  // namespace mcc
