#include "core/comm/hang_analysis.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace comm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

nlohmann::json Coll(int64_t id, std::string group, std::vector<int> ranks,
                    std::string signature, int64_t seq, std::string state) {
  const std::string op = signature.substr(0, signature.find('('));
  return {{"id", id},
          {"group", group},
          {"group_ranks", ranks},
          {"op", op},
          {"signature", signature},
          {"seq", seq},
          {"p2p_index", -1},
          {"peer", -1},
          {"state", state}};
}

nlohmann::json P2p(int64_t id, std::string group, std::vector<int> ranks,
                   std::string op, int64_t index, int peer, std::string state) {
  return {{"id", id},
          {"group", group},
          {"group_ranks", ranks},
          {"op", op},
          {"signature", op + "(fp32[4])"},
          {"seq", -1},
          {"p2p_index", index},
          {"peer", peer},
          {"state", state}};
}

std::string Dump(int rank, std::vector<nlohmann::json> entries) {
  return nlohmann::json{{"rank", rank}, {"entries", entries}}.dump();
}

TEST(HangAnalysisTest, NamesTheRankBehindAndTheCallItIsIn) {
  const std::vector<int> dp = {0, 1, 2, 3}, pp = {1, 3};
  std::map<std::string, std::string> dumps;
  for (int r = 0; r < 3; ++r) {
    dumps["r" + std::to_string(r)] =
        Dump(r, {Coll(0, "dp", dp, "AllReduce(sum, fp32[8])", 511, "completed"),
                 Coll(1, "dp", dp, "AllReduce(sum, fp32[8])", 512, "started")});
  }
  dumps["r3"] =
      Dump(3, {Coll(0, "dp", dp, "AllReduce(sum, fp32[8])", 511, "completed"),
               P2p(1, "pp", pp, "Send", 88, 1, "started")});
  absl::StatusOr<std::vector<std::string>> f = AnalyzeHang(dumps);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT(
      *f, ElementsAre("ranks 0-2 wait in AllReduce #512 of group 'dp'; rank 3 "
                      "last finished #511 of group 'dp' and is in Send (p2p "
                      "#88) to rank 1 of group 'pp'"));
}

TEST(HangAnalysisTest, NamesABatchOfTransfersByItsPeer) {
  const std::vector<int> dp = {0, 1, 2, 3}, pp = {1, 3};
  std::map<std::string, std::string> dumps;
  for (int r = 0; r < 3; ++r) {
    dumps["r" + std::to_string(r)] =
        Dump(r, {Coll(0, "dp", dp, "AllReduce(sum, fp32[8])", 7, "started")});
  }
  dumps["r3"] = Dump(3, {P2p(1, "pp", pp, "BatchP2P", 12, 1, "started")});
  absl::StatusOr<std::vector<std::string>> f = AnalyzeHang(dumps);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_FALSE(f->empty());
  EXPECT_THAT((*f)[0],
              HasSubstr("is in BatchP2P (p2p #12) with rank 1 of group 'pp'"));
}

TEST(HangAnalysisTest, NamesARankThatLeftNoDump) {
  const std::vector<int> world = {0, 1, 2};
  std::map<std::string, std::string> dumps;
  for (int r = 0; r < 2; ++r) {
    dumps["r" + std::to_string(r)] =
        Dump(r, {Coll(0, "world", world, "Barrier()", 3, "started")});
  }
  absl::StatusOr<std::vector<std::string>> f = AnalyzeHang(dumps);
  ASSERT_TRUE(f.ok());
  EXPECT_THAT((*f)[0], HasSubstr("ranks 0-1 wait in Barrier #3 of group "
                                 "'world'; rank 2 left no dump"));
  EXPECT_THAT(f->back(), "rank 2 left no dump");
}

TEST(HangAnalysisTest, NamesRanksThatCalledDifferentCollectives) {
  const std::vector<int> world = {0, 1};
  std::map<std::string, std::string> dumps = {
      {"a", Dump(0, {Coll(0, "world", world, "Broadcast(fp32[4], root 0)", 0,
                          "started")})},
      {"b", Dump(1, {Coll(0, "world", world, "AllReduce(sum, fp32[4])", 0,
                          "started")})}};
  absl::StatusOr<std::vector<std::string>> f = AnalyzeHang(dumps);
  ASSERT_TRUE(f.ok());
  EXPECT_THAT((*f)[0],
              HasSubstr("ranks disagree on collective #0 of group 'world'"));
  EXPECT_THAT((*f)[0], HasSubstr("rank 0 call Broadcast(fp32[4], root 0)"));
  EXPECT_THAT((*f)[0], HasSubstr("rank 1 call AllReduce(sum, fp32[4])"));
}

TEST(HangAnalysisTest, BadDumpNamesTheFile) {
  absl::StatusOr<std::vector<std::string>> f =
      AnalyzeHang({{"flight_recorder_rank7.json", "{"}});
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("flight_recorder_rank7.json"));
}

// Members of the wrong type threw nlohmann's type_error out of value(),
// aborting analyze_hang.
TEST(HangAnalysisTest, WrongTypedFieldsNameTheFileAndField) {
  const nlohmann::json good =
      Coll(1, "dp", {0, 1}, "AllReduce(fp32[4])", 0, "started");
  struct Case {
    std::string dump;
    std::string want;
  } cases[] = {
      {R"({"rank": "0", "entries": []})", "\"rank\" must be an integer"},
      {R"({"rank": 0, "reason": 5, "entries": []})", "\"reason\" must be"},
      {R"({"rank": 0, "entries": [7]})",
       "entries[0]: expected a JSON object, found number"},
      {R"({"rank": 4294967296, "entries": []})", "not a rank"},
  };
  std::vector<Case> all(std::begin(cases), std::end(cases));
  for (const char* key : {"id", "group", "group_ranks", "op", "signature",
                          "state", "seq", "p2p_index", "peer"}) {
    nlohmann::json bad = good;
    bad[key] = bad[key].is_string() ? nlohmann::json(3) : nlohmann::json("x");
    all.push_back({nlohmann::json{{"rank", 0}, {"entries", {good, bad}}}.dump(),
                   absl::StrCat("entries[1]: \"", key, "\" must be")});
  }
  nlohmann::json bad_ranks = good;
  bad_ranks["group_ranks"] = {0, -5};
  all.push_back({nlohmann::json{{"rank", 0}, {"entries", {bad_ranks}}}.dump(),
                 "not a rank"});
  for (const Case& c : all) {
    absl::StatusOr<std::vector<std::string>> f =
        AnalyzeHang({{"flight_recorder_rank0.json", c.dump}});
    ASSERT_FALSE(f.ok()) << c.dump;
    EXPECT_THAT(f.status().message(),
                HasSubstr("flight_recorder_rank0.json: "));
    EXPECT_THAT(f.status().message(), HasSubstr(c.want)) << c.dump;
  }
}

}  // namespace
}  // namespace comm
}  // namespace mcc
