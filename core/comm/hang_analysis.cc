#include "core/comm/hang_analysis.h"

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/json_document.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace comm {
namespace {

struct Entry {
  int64_t id = 0;
  std::string group;
  std::vector<int> group_ranks;
  std::string op, signature, state;
  int64_t seq = -1, p2p_index = -1;
  int peer = -1;
};

struct RankDump {
  int rank = 0;
  std::string reason;
  std::vector<Entry> entries;
};

// "0-2, 5" for {0, 1, 2, 5}.
std::string RankRanges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  std::vector<std::string> parts;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(ranks[i])
                           : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

std::string Ranks(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      RankRanges(ranks));
}

std::string Describe(const Entry& e) {
  if (e.seq >= 0) {
    return absl::StrCat(e.op, " #", e.seq, " of group '", e.group, "'");
  }
  // A batch (BatchP2P) names its peer when it has only one.
  const char* direction =
      e.op == "Recv" ? "from" : (e.op == "Send" ? "to" : "with");
  if (e.peer < 0) {
    return absl::StrCat(e.op, " (p2p #", e.p2p_index, ") of group '", e.group,
                        "'");
  }
  return absl::StrCat(e.op, " (p2p #", e.p2p_index, ") ", direction, " rank ",
                      e.peer, " of group '", e.group, "'");
}

// A rank (or -1 for none) in an int.
absl::StatusOr<int> RankMember(const nlohmann::json& object,
                               absl::string_view key, int fallback,
                               absl::string_view where) {
  MCC_ASSIGN_OR_RETURN(const int64_t v,
                       JsonIntMember(object, key, fallback, where));
  if (v < -1 || v > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" is ", v, ", not a rank"));
  }
  return static_cast<int>(v);
}

// Groups are told apart by name and members (subgroups of one name on
// different ranks are different groups).
using GroupKey = std::pair<std::string, std::vector<int>>;

}  // namespace

absl::StatusOr<std::vector<std::string>> AnalyzeHang(
    const std::map<std::string, std::string>& dumps, int world_size) {
  std::map<int, RankDump> by_rank;
  for (const auto& [label, text] : dumps) {
    nlohmann::json doc =
        nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object() || !doc.contains("rank") ||
        !doc.contains("entries") || !doc["entries"].is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": not a flight-recorder dump (JSON with rank and entries)"));
    }
    // Every member is read by type: a wrong-typed one is an error naming the
    // file, the entry and the field (nlohmann's value() would throw).
    RankDump d;
    MCC_ASSIGN_OR_RETURN(d.rank, RankMember(doc, "rank", 0, label));
    MCC_ASSIGN_OR_RETURN(d.reason, JsonStringMember(doc, "reason", "", label));
    const nlohmann::json& entries = doc["entries"];
    for (size_t i = 0; i < entries.size(); ++i) {
      const nlohmann::json& j = entries[i];
      const std::string where = absl::StrCat(label, ": entries[", i, "]");
      Entry e;
      MCC_ASSIGN_OR_RETURN(e.id, JsonIntMember(j, "id", 0, where));
      MCC_ASSIGN_OR_RETURN(e.group, JsonStringMember(j, "group", "", where));
      MCC_ASSIGN_OR_RETURN(std::vector<int64_t> group_ranks,
                           JsonIntArrayMember(j, "group_ranks", where));
      for (int64_t r : group_ranks) {
        if (r < 0 || r > std::numeric_limits<int>::max()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": \"group_ranks\" holds ", r, ", not a rank"));
        }
        e.group_ranks.push_back(static_cast<int>(r));
      }
      MCC_ASSIGN_OR_RETURN(e.op, JsonStringMember(j, "op", "", where));
      MCC_ASSIGN_OR_RETURN(e.signature,
                           JsonStringMember(j, "signature", "", where));
      MCC_ASSIGN_OR_RETURN(e.state, JsonStringMember(j, "state", "", where));
      MCC_ASSIGN_OR_RETURN(e.seq, JsonIntMember(j, "seq", -1, where));
      MCC_ASSIGN_OR_RETURN(e.p2p_index,
                           JsonIntMember(j, "p2p_index", -1, where));
      MCC_ASSIGN_OR_RETURN(e.peer, RankMember(j, "peer", -1, where));
      d.entries.push_back(std::move(e));
    }
    if (by_rank.count(d.rank)) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ": a second dump of rank ", d.rank));
    }
    by_rank[d.rank] = std::move(d);
  }
  std::set<int> known;
  for (int r = 0; r < world_size; ++r) known.insert(r);
  std::set<GroupKey> groups;
  for (const auto& [rank, d] : by_rank) {
    known.insert(rank);
    for (const Entry& e : d.entries) {
      groups.insert({e.group, e.group_ranks});
      known.insert(e.group_ranks.begin(), e.group_ranks.end());
    }
  }
  std::vector<std::string> findings;
  std::vector<int> silent;
  for (int r : known) {
    if (!by_rank.count(r)) silent.push_back(r);
  }
  // The newest unfinished call of a rank, anywhere.
  auto in_call = [&](int rank) -> const Entry* {
    const Entry* last = nullptr;
    for (const Entry& e : by_rank[rank].entries) {
      if (e.state == "started" && (!last || e.id > last->id)) last = &e;
    }
    return last;
  };
  for (const GroupKey& key : groups) {
    // Per member: the highest sequence number started and finished.
    std::map<int64_t, std::map<std::string, std::vector<int>>> waiting;
    std::map<int, int64_t> finished, started;
    for (int r : key.second) {
      if (!by_rank.count(r)) continue;
      finished[r] = started[r] = -1;
      for (const Entry& e : by_rank[r].entries) {
        if (e.group != key.first || e.group_ranks != key.second || e.seq < 0)
          continue;
        started[r] = std::max(started[r], e.seq);
        if (e.state == "started") {
          waiting[e.seq][e.signature].push_back(r);
        } else {
          finished[r] = std::max(finished[r], e.seq);
        }
      }
    }
    for (const auto& [seq, by_signature] : waiting) {
      std::vector<int> waiters;
      std::vector<std::string> parts;
      for (const auto& [signature, ranks] : by_signature) {
        waiters.insert(waiters.end(), ranks.begin(), ranks.end());
      }
      if (by_signature.size() > 1) {
        for (const auto& [signature, ranks] : by_signature) {
          parts.push_back(absl::StrCat(Ranks(ranks), " call ", signature));
        }
        findings.push_back(absl::StrCat("ranks disagree on collective #", seq,
                                        " of group '", key.first,
                                        "': ", absl::StrJoin(parts, "; ")));
      }
      const std::string op = by_signature.begin()->first.substr(
          0, by_signature.begin()->first.find('('));
      std::string line = absl::StrCat(Ranks(waiters), " wait in ", op, " #",
                                      seq, " of group '", key.first, "'");
      for (int r : key.second) {
        if (std::find(waiters.begin(), waiters.end(), r) != waiters.end())
          continue;
        if (!by_rank.count(r)) {
          absl::StrAppend(&line, "; rank ", r,
                          " left no dump: stopped, killed, or stuck outside "
                          "any collective");
          continue;
        }
        if (started[r] >= seq) continue;  // It finished this one.
        absl::StrAppend(&line, "; rank ", r, " last finished #", finished[r],
                        " of group '", key.first, "'");
        if (const Entry* e = in_call(r)) {
          absl::StrAppend(&line, " and is in ", Describe(*e));
        } else {
          absl::StrAppend(&line, " and is in no collective or p2p call");
        }
      }
      findings.push_back(std::move(line));
    }
  }
  // Ranks stuck in p2p calls only (not waiting in any collective).
  for (const auto& [rank, d] : by_rank) {
    const Entry* e = in_call(rank);
    if (e != nullptr && e->seq < 0) {
      bool mentioned = false;
      for (const std::string& f : findings) {
        if (f.find(Describe(*e)) != std::string::npos) mentioned = true;
      }
      if (!mentioned) {
        findings.push_back(
            absl::StrCat("rank ", rank, " waits in ", Describe(*e)));
      }
    }
  }
  if (!silent.empty()) {
    findings.push_back(absl::StrCat(Ranks(silent), " left no dump"));
  }
  if (findings.empty()) {
    findings.push_back("no rank waits in a collective or p2p call");
  }
  return findings;
}

}  // namespace comm
}  // namespace mcc
