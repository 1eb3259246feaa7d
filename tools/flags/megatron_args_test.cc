#include "tools/flags/megatron_args.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tools/flags/train_config_from_flags.h"
#include "tools/flags/training_flags.h"
#include "training/model_from_config.h"
#include "training/train_config.pb.h"

namespace mcc {
namespace flags {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<ParsedArgs> Parse(std::vector<std::string> words) {
  std::vector<char*> argv;
  static std::string program = "train";
  argv.push_back(program.data());
  for (auto& w : words) argv.push_back(w.data());
  return ParseMegatronArgs(static_cast<int>(argv.size()), argv.data(),
                           {"data_path"});
}

TEST(MegatronArgsTest, DashedUnderscoredAndEqualsForms) {
  auto parsed = Parse({"--num-layers", "6", "--hidden_size=96", "--bf16",
                       "--nosequence-parallel", "--seq-length=64"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_num_layers), 6);
  EXPECT_EQ(absl::GetFlag(FLAGS_hidden_size), 96);
  EXPECT_TRUE(absl::GetFlag(FLAGS_bf16));
  EXPECT_FALSE(absl::GetFlag(FLAGS_sequence_parallel));
  EXPECT_EQ(absl::GetFlag(FLAGS_seq_length), 64);
  EXPECT_TRUE(parsed->explicitly_set.count("num_layers"));
  absl::SetFlag(&FLAGS_bf16, false);
}

TEST(MegatronArgsTest, HelpIsAPositionalWord) {
  auto parsed = Parse({"--help"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->positional, std::vector<std::string>{"help"});
}

TEST(MegatronArgsTest, MultiWordDataPath) {
  auto parsed =
      Parse({"--data-path", "0.3", "a/b", "0.7", "c/d", "--split", "98,2,0"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_data_path), "0.3 a/b 0.7 c/d");
  EXPECT_EQ(absl::GetFlag(FLAGS_split), "98,2,0");
}

TEST(MegatronArgsTest, ErrorsNameTheFlag) {
  EXPECT_THAT(std::string(Parse({"--num-layrs", "2"}).status().message()),
              HasSubstr("unknown flag --num-layrs"));
  EXPECT_THAT(std::string(Parse({"--num-layers", "two"}).status().message()),
              HasSubstr("--num-layers"));
  EXPECT_THAT(std::string(Parse({"--hidden-size"}).status().message()),
              HasSubstr("--hidden-size needs a value"));
}

TEST(MegatronArgsTest, NegatedBooleansInBothSpellings) {
  absl::SetFlag(&FLAGS_swiglu, true);
  ASSERT_TRUE(Parse({"--no-swiglu"}).ok());  // Megatron's argparse.
  EXPECT_FALSE(absl::GetFlag(FLAGS_swiglu));
  absl::SetFlag(&FLAGS_swiglu, true);
  ASSERT_TRUE(Parse({"--noswiglu"}).ok());  // Abseil's.
  EXPECT_FALSE(absl::GetFlag(FLAGS_swiglu));
  // Not for values: --no-swiglu=true is not a flag.
  EXPECT_FALSE(Parse({"--no-swiglu=true"}).ok());
}

TEST(MegatronArgsTest, FlagFilesAreReadInPlace) {
  const std::string dir =
      getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
  std::ofstream(dir + "/a.flags") << "# model\n--num-layers=5\n\n"
                                  << "--flagfile=" << dir << "/b.flags\n";
  std::ofstream(dir + "/b.flags") << "  --hidden-size=72  \n";
  // Later words override the file's, as on a command line.
  auto parsed = Parse({"--flagfile", dir + "/a.flags", "--num-layers", "7"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_num_layers), 7);
  EXPECT_EQ(absl::GetFlag(FLAGS_hidden_size), 72);
  EXPECT_TRUE(parsed->explicitly_set.count("hidden_size"));
  EXPECT_THAT(
      std::string(Parse({"--flagfile=/nonexistent/f"}).status().message()),
      HasSubstr("--flagfile: cannot read '/nonexistent/f'"));
  std::ofstream(dir + "/loop.flags") << "--flagfile=" << dir << "/loop.flags\n";
  EXPECT_THAT(
      std::string(
          Parse({"--flagfile=" + dir + "/loop.flags"}).status().message()),
      HasSubstr("--flagfile"));
}

TEST(MegatronArgsTest, AbseilsEnvironmentFlagsAreRefused) {
  for (const char* flag :
       {"--fromenv=seed", "--tryfromenv=seed", "--undefok=foo"}) {
    absl::Status s = Parse({flag}).status();
    EXPECT_THAT(std::string(s.message()), HasSubstr(std::string(flag).substr(
                                              0, std::string(flag).find('='))))
        << flag;
  }
}

TEST(MegatronArgsTest, UnusedFlagsAreRefusedOrWarnedOnlyWhenGiven) {
  const std::vector<UnusedFlag> rules = {{"seed", true, "seeds nothing here"},
                                         {"num_layers", false, "never shown"}};
  absl::SetFlag(&FLAGS_seed, 1234);  // The default: not given.
  EXPECT_TRUE(RefuseUnusedFlags(rules, {}).ok());
  EXPECT_TRUE(UnusedFlagWarnings(rules, {}).empty());
  // On the command line, even at its default value.
  EXPECT_THAT(std::string(RefuseUnusedFlags(rules, {"seed"}).message()),
              HasSubstr("--seed: seeds nothing here"));
  // Or changed from its default by a config file.
  absl::SetFlag(&FLAGS_seed, 7);
  EXPECT_EQ(UnusedFlagWarnings(rules, {}),
            std::vector<std::string>{
                "--seed has no effect in this run: seeds nothing here"});
  absl::SetFlag(&FLAGS_seed, 1234);
}

TEST(MegatronArgsTest, ConfigFileIsOverriddenByFlags) {
  const std::string path =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
      "/train.textproto";
  std::ofstream(path) << "num_layers: 3\nhidden_size: 80\n"
                         "data_path: \"0.5 x 0.5 y\"\n";
  auto parsed = Parse({"--hidden-size", "48"});
  ASSERT_TRUE(parsed.ok());
  ASSERT_TRUE(
      ApplyConfigFile(path, training::TrainConfig(), parsed->explicitly_set)
          .ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_num_layers), 3);
  EXPECT_EQ(absl::GetFlag(FLAGS_hidden_size), 48);
  EXPECT_EQ(absl::GetFlag(FLAGS_data_path), "0.5 x 0.5 y");

  std::ofstream(path) << "num_layers: \"many\"\n";
  absl::Status bad = ApplyConfigFile(path, training::TrainConfig(), {});
  EXPECT_THAT(std::string(bad.message()), HasSubstr(path));
  EXPECT_THAT(std::string(bad.message()), HasSubstr("line 1"));
}

TEST(TrainingFlagsTest, GPTConfigChecksDivisibility) {
  absl::SetFlag(&FLAGS_num_layers, 2);
  absl::SetFlag(&FLAGS_hidden_size, 64);
  absl::SetFlag(&FLAGS_num_attention_heads, 6);
  absl::SetFlag(&FLAGS_tensor_model_parallel_size, 4);
  absl::Status s =
      training::GPTConfigFromConfig(*TrainConfigFromFlags(), 257).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("--hidden-size (64)"));
  absl::SetFlag(&FLAGS_num_attention_heads, 4);
  auto ok = training::GPTConfigFromConfig(*TrainConfigFromFlags(), 257);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->vocab_size, 257);  // The model; its padding is the layout's:
  EXPECT_EQ(ok->padded_vocab_size(4), 512);  // a multiple of 128 x 4.
  absl::SetFlag(&FLAGS_tensor_model_parallel_size, 1);
}

TEST(TrainingFlagsTest, WindowSizeTakesALeftWindowOnly) {
  EXPECT_EQ(*training::WindowLeftOf(""), -1);
  EXPECT_EQ(*training::WindowLeftOf("4096,0"), 4096);
  EXPECT_EQ(*training::WindowLeftOf("(7, 0)"), 7);
  for (const char* bad : {"4,4", "-1,-1", "4", "a,0", "1,2,3"}) {
    absl::StatusOr<int64_t> w = training::WindowLeftOf(bad);
    ASSERT_FALSE(w.ok()) << bad;
    EXPECT_THAT(std::string(w.status().message()), HasSubstr("--window-size"));
  }
  // A window reaching past the sequence is refused by name.
  absl::SetFlag(&FLAGS_window_size, "500,0");
  absl::SetFlag(&FLAGS_seq_length, 128);
  absl::Status s =
      training::GPTConfigFromConfig(*TrainConfigFromFlags(), 257).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("--window-size"));
  absl::SetFlag(&FLAGS_window_size, "");
}

}  // namespace
}  // namespace flags
}  // namespace mcc
