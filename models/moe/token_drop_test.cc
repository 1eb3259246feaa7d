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

}  // namespace
}  // namespace moe
}  // namespace mcc
