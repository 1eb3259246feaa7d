#include "models/gpt/moe_layer_pattern.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "models/gpt/gpt_config.h"

namespace mcc {
namespace gpt {
namespace {

std::vector<bool> Parse(const std::string& freq, int layers) {
  auto p = ParseMoeLayerFreq(freq, layers);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : std::vector<bool>();
}

TEST(MoeLayerPatternTest, AnIntegerPicksEveryNthLayerFromTheFirst) {
  EXPECT_EQ(Parse("1", 3), std::vector<bool>({true, true, true}));
  EXPECT_EQ(Parse("2", 5), std::vector<bool>({true, false, true, false, true}));
  EXPECT_EQ(Parse("4", 2), std::vector<bool>({true, false}));
}

TEST(MoeLayerPatternTest, MegatronListExpressions) {
  EXPECT_EQ(Parse("[1,0,1,0]", 4),
            std::vector<bool>({true, false, true, false}));
  EXPECT_EQ(Parse("([0]+[1]*3)", 4),
            std::vector<bool>({false, true, true, true}));
  EXPECT_EQ(Parse(" ( [1] * 2 + [0] ) * 2 ", 6),
            std::vector<bool>({true, true, false, true, true, false}));
  EXPECT_EQ(Parse("[0]*2+[1]", 3), std::vector<bool>({false, false, true}));
}

TEST(MoeLayerPatternTest, CanonicalStringReadsBack) {
  const std::vector<bool> p = {false, true, true, false};
  EXPECT_EQ(MoeLayerPatternString(p), "[0,1,1,0]");
  EXPECT_EQ(Parse(MoeLayerPatternString(p), 4), p);
}

TEST(MoeLayerPatternTest, BadPatternsAreRefusedByName) {
  for (const auto& [freq, what] :
       std::vector<std::pair<std::string, std::string>>{
           {"0", "at least 1"},
           {"-2", "at least 1"},
           {"[1,0,1]", "lists 3 layers, but --num-layers is 4"},
           {"[1,2,1,0]", "entry 2 is not 0 or 1"},
           {"[1,0]*2]", "unexpected text"},
           {"([1]*4", "expected ')'"},
           {"every", "expected '[' or '('"},
           {"[1]*99999999999", "non-negative integer"}}) {
    auto p = ParseMoeLayerFreq(freq, 4);
    ASSERT_FALSE(p.ok()) << freq;
    EXPECT_NE(p.status().message().find("--moe-layer-freq"), std::string::npos)
        << p.status();
    EXPECT_NE(p.status().message().find(what), std::string::npos) << p.status();
  }
}

TEST(MoeLayerPatternTest, ConfigPicksLayersAndValidatesByFlagName) {
  GPTConfig c;
  c.num_layers = 4;
  c.add_bias_linear = false;
  EXPECT_FALSE(c.IsMoeLayer(0));  // Dense without --num-experts.
  c.num_experts = 4;
  c.moe_layer_freq = "([0]+[1]*3)";
  EXPECT_FALSE(c.IsMoeLayer(0));
  EXPECT_TRUE(c.IsMoeLayer(3));
  EXPECT_TRUE(c.Validate(1, false).ok());
  c.moe_router_topk = 5;
  absl::Status s = c.Validate(1, false);
  EXPECT_NE(s.message().find("--moe-router-topk (5)"), std::string::npos) << s;
  c.moe_router_topk = 2;
  // Replicated over TP without SP; each TP rank's own tokens with SP, but
  // token dropping there is refused.
  EXPECT_TRUE(c.Validate(2, false).ok());
  EXPECT_TRUE(c.Validate(2, true).ok());
  c.moe_expert_capacity_factor = 1.0;
  EXPECT_TRUE(c.Validate(2, false).ok());
  s = c.Validate(2, true);
  EXPECT_NE(s.message().find("--moe-expert-capacity-factor with "
                             "--sequence-parallel"),
            std::string::npos)
      << s;
  c.moe_expert_capacity_factor = 0;
  c.add_bias_linear = true;
  s = c.Validate(1, false);
  EXPECT_NE(s.message().find("--disable-bias-linear"), std::string::npos) << s;
}

}  // namespace
}  // namespace gpt
}  // namespace mcc
