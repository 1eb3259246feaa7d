// Supervised fine-tuning end to end below the binaries: a 3-turn
// conversation through preprocess (chat template, loss-mask companion), the
// GPT dataset and the loader into the model's loss. Only the assistant's
// tokens may count: the test finds them in a rendering written out by hand,
// counts them, and checks the loss and gradients against the same batch
// whose other labels are ignored (-100), a path that never reads the mask.
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/blended_dataset.h"
#include "data/conversation_preprocess.h"
#include "data/loader.h"
#include "data/test_util.h"
#include "data/tokenizer.h"
#include "gtest/gtest.h"
#include "models/gpt/gpt_model.h"

namespace mcc {
namespace training {
namespace {

constexpr char kChatMl[] =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
    "<|im_start|>assistant\n{% endif %}";

// The rendering of kConversation, by hand.
const char* const kRendered =
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nHi!<|im_end|>\n"
    "<|im_start|>assistant\nHello there.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\nFour.<|im_end|>\n"
    "<|im_start|>user\nThanks!<|im_end|>\n"
    "<|im_start|>assistant\nYou are welcome.<|im_end|>\n";
const char* const kAnswers[] = {"Hello there.<|im_end|>\n", "Four.<|im_end|>\n",
                                "You are welcome.<|im_end|>\n"};

TEST(SftLossTest, OnlyTheAssistantsTokensCount) {
  const std::string dir = data::testing::TempDir("sft_loss");
  data::testing::WriteAll(
      dir + "/c.jsonl",
      R"({"messages": [{"role": "system", "content": "Be brief."},)"
      R"( {"role": "user", "content": "Hi!"},)"
      R"( {"role": "assistant", "content": "Hello there."},)"
      R"( {"role": "user", "content": "What is 2+2?"},)"
      R"( {"role": "assistant", "content": "Four."},)"
      R"( {"role": "user", "content": "Thanks!"},)"
      R"( {"role": "assistant", "content": "You are welcome."}]})"
      "\n");
  auto tokenizer = data::MakeByteTokenizer();  // one token a byte
  data::ConversationPreprocessOptions po;
  po.input = dir + "/c.jsonl";
  po.output_prefix = dir + "/c";
  auto stats = data::PreprocessConversations(po, {kChatMl, "", "<|im_end|>"},
                                             *tokenizer);
  ASSERT_TRUE(stats.ok()) << stats.status();

  // The assistant's bytes in the hand rendering.
  const std::string text = kRendered;
  std::vector<bool> assistant(text.size(), false);
  int64_t expected = 0;
  size_t from = 0;
  for (const char* answer : kAnswers) {
    const std::string a = std::string("<|im_start|>assistant\n") + answer;
    const size_t at = text.find(a, from);
    ASSERT_NE(at, std::string::npos) << answer;
    const size_t begin = at + a.size() - std::string(answer).size();
    for (size_t i = begin; i < at + a.size(); ++i) assistant[i] = true;
    expected += static_cast<int64_t>(std::string(answer).size());
    from = at + a.size();
  }
  EXPECT_EQ(expected, 23 + 16 + 27);

  // One document, one sample of exactly its tokens.
  const int64_t seq = static_cast<int64_t>(text.size()) - 1;
  data::GPTDatasetConfig dc;
  dc.sequence_length = static_cast<int32_t>(seq);
  dc.loss_mask = true;
  dc.path_to_cache = dir + "/cache";
  auto blend = data::ParseDataPath(dir + "/c_messages_document");
  ASSERT_TRUE(blend.ok());
  auto sets = data::BuildGPTDatasets(*blend, "100,0,0",
                                     {1, std::nullopt, std::nullopt}, dc);
  ASSERT_TRUE(sets.ok()) << sets.status();
  data::LoaderConfig lc;
  data::MicroBatch mb = data::MakeMicroBatch(*(*sets)[0], 0, lc);
  const std::vector<double> tokens = mb.tokens.ToDoubles();
  const std::vector<double> labels = mb.labels.ToDoubles();
  const std::vector<double> mask = mb.loss_mask.ToDoubles();
  ASSERT_EQ(static_cast<int64_t>(tokens.size()), seq);
  int64_t counted = 0;
  std::vector<int64_t> ref_labels(seq);
  for (int64_t i = 0; i < seq; ++i) {
    ASSERT_EQ(tokens[i], static_cast<unsigned char>(text[i])) << i;
    // Position i predicts byte i + 1.
    EXPECT_EQ(mask[i], assistant[i + 1] ? 1.0 : 0.0) << i;
    counted += mask[i] == 1.0;
    ref_labels[i] = assistant[i + 1] ? static_cast<int64_t>(labels[i]) : -100;
  }
  EXPECT_EQ(counted, expected);

  gpt::GPTConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 257;
  c.seq_length = seq;
  c.max_position_embeddings = seq;
  c.seed = 5;
  parallel::LayerContext ctx;
  ctx.seed = c.seed;
  auto model = gpt::GPTModel::Create(c, ctx);
  ASSERT_TRUE(model.ok()) << model.status();
  gpt::MicroBatch sft{mb.tokens, mb.labels, mb.loss_mask};
  gpt::MicroBatch ref{mb.tokens, *Tensor::FromInts(ref_labels, {1, seq}),
                      Tensor()};
  gpt::MicroBatch all{mb.tokens, mb.labels, Tensor()};
  auto grads = [&](const gpt::MicroBatch& b, parallel::LossSum* loss) {
    (*model)->ZeroGradients();
    auto l = (*model)->ForwardBackward(b, 1.0f);
    EXPECT_TRUE(l.ok()) << l.status();
    *loss = *l;
    std::vector<float> g;
    for (const auto& p : (*model)->parameters()) {
      const std::vector<float> pg = p->main_grad.ToFloats();
      g.insert(g.end(), pg.begin(), pg.end());
    }
    return g;
  };
  parallel::LossSum l_sft, l_ref, l_all;
  const std::vector<float> g_sft = grads(sft, &l_sft);
  const std::vector<float> g_ref = grads(ref, &l_ref);
  grads(all, &l_all);
  EXPECT_EQ(l_sft.tokens, expected);
  EXPECT_EQ(l_ref.tokens, expected);
  EXPECT_EQ(l_all.tokens, seq);
  EXPECT_NEAR(l_sft.mean(), l_ref.mean(), 1e-6);
  // Fails if the mask is ignored: every token would count.
  EXPECT_GT(std::abs(l_all.mean() - l_sft.mean()), 1e-3);
  ASSERT_EQ(g_sft.size(), g_ref.size());
  double worst = 0;
  for (size_t i = 0; i < g_sft.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(g_sft[i] - g_ref[i])));
  }
  EXPECT_LT(worst, 1e-6);
}

}  // namespace
}  // namespace training
}  // namespace mcc
