#include "models/moe/token_drop.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace mcc {
namespace moe {
namespace {

using ::testing::HasSubstr;

TEST(TokenDropTest, CapacityIsMegatronsCeiling) {
  EXPECT_EQ(ExpertCapacity(10, 2, 4, 1.0), 5);   // ceil(5)
  EXPECT_EQ(ExpertCapacity(10, 2, 4, 1.25), 7);  // ceil(6.25)
  EXPECT_EQ(ExpertCapacity(10, 2, 4, 0.3), 2);   // ceil(1.5)
  EXPECT_EQ(ExpertCapacity(4096, 8, 64, 1.0), 512);
}

TEST(TokenDropTest, PolicyNamesAndRefusal) {
  EXPECT_EQ(*ParseTokenDropPolicy("probs"), TokenDropPolicy::kProbs);
  EXPECT_EQ(*ParseTokenDropPolicy("position"), TokenDropPolicy::kPosition);
  auto bad = ParseTokenDropPolicy("random");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("--moe-token-drop-policy 'random'"));
}

// Random routings (k distinct experts per token) with weights drawn from a
// few values, so equal weights compete for the last places; the selection
// against a float64 reference that sorts each expert's candidates.
TEST(TokenDropTest, MatchesAFloat64Reference) {
  const int64_t t = 64, k = 3, e = 6;
  std::mt19937 gen(3);
  for (TokenDropPolicy policy :
       {TokenDropPolicy::kProbs, TokenDropPolicy::kPosition}) {
    for (int64_t cap : {0, 1, 7, 20, 32, 64}) {
      std::vector<float> w(t * k);
      Tensor idx = Tensor::Empty({t, k}, DType::kInt32);
      for (int64_t r = 0; r < t; ++r) {
        std::vector<int> experts(e);
        for (int j = 0; j < e; ++j) experts[j] = j;
        std::shuffle(experts.begin(), experts.end(), gen);
        for (int64_t i = 0; i < k; ++i) {
          idx.data<int32_t>()[r * k + i] = experts[i];
          w[r * k + i] = 0.125f * (1 + gen() % 5);
        }
      }
      Tensor wt = *Tensor::FromVector(w, {t, k}, DType::kFloat32);
      Tensor out_idx = Tensor::Empty({t, k}, DType::kInt32);
      Tensor out_w = Tensor::Empty({t, k}, DType::kFloat32);
      const int64_t dropped =
          *DropOverCapacity(idx, wt, e, cap, policy, &out_idx, &out_w);
      // Reference: per expert, (-weight, token) ascending for probs, token
      // ascending for position; the first cap are kept.
      std::vector<char> kept(t * k, 1);
      for (int ex = 0; ex < e; ++ex) {
        std::vector<std::pair<double, int64_t>> cand;
        for (int64_t s = 0; s < t * k; ++s) {
          if (idx.data<int32_t>()[s] != ex) continue;
          const double key = policy == TokenDropPolicy::kProbs
                                 ? -static_cast<double>(w[s])
                                 : 0.0;
          cand.push_back({key, s});
        }
        std::sort(cand.begin(), cand.end());
        for (size_t i = cap; i < cand.size(); ++i) kept[cand[i].second] = 0;
      }
      int64_t ref_dropped = 0;
      for (int64_t s = 0; s < t * k; ++s) {
        ref_dropped += !kept[s];
        EXPECT_EQ(out_idx.data<int32_t>()[s],
                  kept[s] ? idx.data<int32_t>()[s] : e)
            << TokenDropPolicyName(policy) << " cap " << cap << " slot " << s;
        EXPECT_EQ(out_w.data<float>()[s], kept[s] ? w[s] : 0.0f);
      }
      EXPECT_EQ(dropped, ref_dropped);
      if (cap == 0) {
        EXPECT_EQ(dropped, t * k);
      }
      if (cap == 64) {
        EXPECT_EQ(dropped, 0);
      }
    }
  }
}

TEST(TokenDropTest, BadIndicesAreRefused) {
  Tensor idx = *Tensor::FromInts({0, 4}, {1, 2});
  idx = *idx.To(DType::kInt32);
  Tensor w = *Tensor::FromVector({0.5f, 0.5f}, {1, 2}, DType::kFloat32);
  Tensor oi = Tensor::Empty({1, 2}, DType::kInt32);
  Tensor ow = Tensor::Empty({1, 2}, DType::kFloat32);
  auto r = DropOverCapacity(idx, w, 4, 1, TokenDropPolicy::kProbs, &oi, &ow);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("indices[1] = 4 is outside [0, 4)"));
}

// Under CP: each rank's result equals its rows of the serial micro-batch's
// drop. The serial micro-batch is [S, b] (token P * b + j is position P of
// sequence j); CP rank c holds chunks c and 2C - 1 - c of every sequence.
// Weights from a few values, so ties (broken by serial token order) decide
// places; Megatron's per-rank drop gives another result here.
TEST(TokenDropTest, InContextEqualsTheSerialMicroBatch) {
  const int64_t s = 16, b = 2, k = 2, e = 4;
  std::mt19937 gen(11);
  for (int cp : {2, 4}) {
    for (TokenDropPolicy policy :
         {TokenDropPolicy::kProbs, TokenDropPolicy::kPosition}) {
      const int64_t total = s * b, t = total / cp, chunk = s / (2 * cp);
      std::vector<int> idx(total * k);
      std::vector<float> w(total * k);
      for (int64_t r = 0; r < total; ++r) {
        // Skewed towards expert 0 so it overflows.
        const int first = gen() % 3 == 0 ? 1 + gen() % (e - 1) : 0;
        const int second = (first + 1 + gen() % (e - 1)) % e;
        idx[r * k] = first;
        idx[r * k + 1] = second;
        w[r * k] = 0.25f * (1 + gen() % 3);
        w[r * k + 1] = 1.0f - w[r * k];
      }
      Tensor serial_idx =
          *Tensor::FromInts(std::vector<int64_t>(idx.begin(), idx.end()),
                            {total, k}, DType::kInt32);
      Tensor serial_w = *Tensor::FromVector(w, {total, k});
      Tensor want_idx = Tensor::Empty({total, k}, DType::kInt32);
      Tensor want_w = Tensor::Empty({total, k}, DType::kFloat32);
      const double factor = 0.75;
      ASSERT_GT(*DropOverCapacity(serial_idx, serial_w, e,
                                  ExpertCapacity(total, k, e, factor), policy,
                                  &want_idx, &want_w),
                0);
      // Each rank's serial rows, in local order; gathered in rank order.
      std::vector<std::vector<int64_t>> rows(cp);
      std::vector<int> gathered_idx;
      std::vector<float> gathered_w;
      for (int c = 0; c < cp; ++c) {
        for (int half = 0; half < 2; ++half) {
          const int64_t g = half == 0 ? c : 2 * cp - 1 - c;
          for (int64_t p = g * chunk; p < (g + 1) * chunk; ++p) {
            for (int64_t j = 0; j < b; ++j) rows[c].push_back(p * b + j);
          }
        }
        for (int64_t r : rows[c]) {
          for (int64_t i = 0; i < k; ++i) {
            gathered_idx.push_back(idx[r * k + i]);
            gathered_w.push_back(w[r * k + i]);
          }
        }
      }
      Tensor all_idx = *Tensor::FromInts(
          std::vector<int64_t>(gathered_idx.begin(), gathered_idx.end()),
          {total, k}, DType::kInt32);
      Tensor all_w = *Tensor::FromVector(gathered_w, {total, k});
      bool megatron_differs = false;
      for (int c = 0; c < cp; ++c) {
        Tensor got_idx = Tensor::Empty({t, k}, DType::kInt32);
        Tensor got_w = Tensor::Empty({t, k}, DType::kFloat32);
        ASSERT_TRUE(DropOverCapacityInContext(all_idx, all_w, b, cp, c, e,
                                              factor, policy, &got_idx, &got_w)
                        .ok());
        for (int64_t r = 0; r < t; ++r) {
          for (int64_t i = 0; i < k; ++i) {
            const int64_t at = rows[c][r] * k + i;
            EXPECT_EQ(got_idx.data<int32_t>()[r * k + i],
                      want_idx.data<int32_t>()[at])
                << "CP " << cp << " rank " << c << " row " << r << " policy "
                << TokenDropPolicyName(policy);
            EXPECT_EQ(got_w.data<float>()[r * k + i], want_w.data<float>()[at]);
          }
        }
        // Megatron's choice: this rank's tokens alone, local capacity.
        Tensor local_idx = *all_idx.Slice(c * t, (c + 1) * t);
        Tensor local_w = *all_w.Slice(c * t, (c + 1) * t);
        Tensor m_idx = Tensor::Empty({t, k}, DType::kInt32);
        Tensor m_w = Tensor::Empty({t, k}, DType::kFloat32);
        ASSERT_TRUE(DropOverCapacity(local_idx, local_w, e,
                                     ExpertCapacity(t, k, e, factor), policy,
                                     &m_idx, &m_w)
                        .ok());
        megatron_differs |= m_idx.ToFloats() != got_idx.ToFloats();
      }
      EXPECT_TRUE(megatron_differs) << "CP " << cp;
    }
  }
}

TEST(TokenDropTest, InContextRefusesMismatchedShapes) {
  Tensor idx = Tensor::Zeros({8, 2}, DType::kInt32);
  Tensor w = Tensor::Zeros({8, 2}, DType::kFloat32);
  Tensor out_idx = Tensor::Empty({3, 2}, DType::kInt32);
  Tensor out_w = Tensor::Empty({3, 2}, DType::kFloat32);
  auto s = DropOverCapacityInContext(idx, w, 1, 2, 0, 4, 1.0,
                                     TokenDropPolicy::kProbs, &out_idx, &out_w);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("DropOverCapacityInContext"));
}

}  // namespace
}  // namespace moe
}  // namespace mcc
