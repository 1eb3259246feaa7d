#include "checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/file_util.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace {

constexpr char kOldSuffix[] = ".old";
constexpr char kTmpSuffix[] = ".tmp";

bool IsComplete(const std::string& iter_dir) {
  return file_util::Exists(file_util::JoinPath(iter_dir, kMetadataFileName));
}

// The iteration of an entry named iter_NNNNNNN + suffix; nullopt otherwise.
std::optional<int64_t> IterationOf(const std::string& name,
                                   absl::string_view suffix) {
  if (!absl::StartsWith(name, "iter_") || !absl::EndsWith(name, suffix)) {
    return std::nullopt;
  }
  int64_t it;
  const std::string digits = name.substr(5, name.size() - 5 - suffix.size());
  if (!absl::SimpleAtoi(digits, &it) || it < 0) return std::nullopt;
  if (name != IterationDirName(it) + std::string(suffix)) return std::nullopt;
  return it;
}

// The names in dir, sorted; none when dir does not exist. A directory that
// cannot be listed is an error: taken for empty, it would start a run fresh.
absl::StatusOr<std::vector<std::string>> EntryNames(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    return absl::InternalError(absl::StrCat("cannot list checkpoint directory ",
                                            dir, ": ", ec.message()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::string IterationDirName(int64_t iteration) {
  return absl::StrFormat("iter_%07d", iteration);
}

std::string ShardFileName(int rank) {
  return absl::StrFormat("shard_r%05d.bin", rank);
}

absl::StatusOr<int64_t> LatestIteration(const std::string& dir) {
  const std::string path = file_util::JoinPath(dir, kLatestFileName);
  auto text = file_util::ReadFileToString(path);
  if (!text.ok()) return text.status();
  int64_t it = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &it) || it < 0) {
    // A damaged file may hold anything: quote only its start.
    const bool long_text = text->size() > 40;
    return absl::DataLossError(
        absl::StrCat(path, " does not hold an iteration number: \"",
                     absl::CHexEscape(absl::string_view(*text).substr(0, 40)),
                     long_text ? "...\"" : "\""));
  }
  return it;
}

std::vector<int64_t> ListCheckpoints(const std::string& dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!absl::StartsWith(name, "iter_")) continue;
    int64_t it;
    if (!absl::SimpleAtoi(name.substr(5), &it)) continue;  // .tmp, .old
    if (name != IterationDirName(it)) continue;
    if (!file_util::Exists(
            file_util::JoinPath(entry.path().string(), kMetadataFileName))) {
      continue;
    }
    out.push_back(it);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<CheckpointLocation> LocateCheckpoint(
    const std::string& dir, int64_t iteration, const std::string& tracker) {
  const std::string path =
      file_util::JoinPath(dir, IterationDirName(iteration));
  const std::string old = path + kOldSuffix;
  if (IsComplete(path)) return CheckpointLocation{iteration, path};
  const std::string named_by =
      tracker.empty()
          ? std::string()
          : absl::StrCat(tracker, " names iteration ", iteration, " but ");
  if (!file_util::Exists(path)) {
    if (IsComplete(old)) {
      LOG(WARNING) << path << " is missing; loading " << old
                   << ", the copy a re-save of iteration " << iteration
                   << " moved aside before it died";
      return CheckpointLocation{iteration, old};
    }
    return absl::DataLossError(absl::StrCat(
        named_by, "the checkpoint of iteration ", iteration, " (", path,
        ") is missing",
        file_util::Exists(old) ? absl::StrCat(" and ", old, " is incomplete")
                               : ""));
  }
  return absl::DataLossError(
      absl::StrCat(named_by, "the checkpoint of iteration ", iteration, " (",
                   path, ") is incomplete: it has no ", kMetadataFileName));
}

absl::StatusOr<std::optional<CheckpointLocation>> FindCheckpointToLoad(
    const std::string& dir) {
  const std::string tracker = file_util::JoinPath(dir, kLatestFileName);
  if (!file_util::Exists(tracker)) {
    // No tracker: a fresh directory, unless checkpoints are there (then
    // starting from scratch would overwrite them at the same iterations).
    MCC_ASSIGN_OR_RETURN(const std::vector<std::string> names, EntryNames(dir));
    std::vector<std::string> found;
    for (const std::string& name : names) {
      const bool checkpoint = IterationOf(name, "").has_value() ||
                              IterationOf(name, kOldSuffix).has_value();
      if (checkpoint && IsComplete(file_util::JoinPath(dir, name))) {
        found.push_back(name);
      }
    }
    if (found.empty()) return std::optional<CheckpointLocation>();
    return absl::FailedPreconditionError(absl::StrCat(
        tracker, " is missing, but ", dir, " holds checkpoints (",
        absl::StrJoin(found, ", "),
        "): write the iteration to resume from into it, or move them away"));
  }
  absl::StatusOr<int64_t> latest = LatestIteration(dir);
  if (!latest.ok()) {
    return absl::Status(latest.status().code(),
                        absl::StrCat("cannot read the checkpoint tracker ",
                                     tracker, ": ", latest.status().message()));
  }
  MCC_ASSIGN_OR_RETURN(CheckpointLocation loc,
                       LocateCheckpoint(dir, *latest, tracker));
  return std::optional<CheckpointLocation>(std::move(loc));
}

absl::StatusOr<bool> ShouldResume(const std::string& load,
                                  const std::string& save, bool log) {
  if (load.empty()) return false;
  MCC_ASSIGN_OR_RETURN(std::optional<CheckpointLocation> found,
                       FindCheckpointToLoad(load));
  if (found.has_value()) return true;
  if (!save.empty() && SameDirectory(load, save)) {
    LOG_IF(INFO, log) << "--load " << load
                      << " holds no checkpoint yet and is also --save: "
                         "starting from scratch (auto-resume)";
    return false;
  }
  return absl::NotFoundError(absl::StrCat(
      "--load ", load, " holds no checkpoint (no ",
      file_util::JoinPath(load, kLatestFileName),
      "); give the directory a run saved into, or, to start fresh and resume "
      "there after a restart, the same directory as --save"));
}

bool SameDirectory(const std::string& a, const std::string& b) {
  auto normal = [](const std::string& p) {
    std::error_code ec;
    std::filesystem::path path = std::filesystem::weakly_canonical(p, ec);
    if (ec) path = std::filesystem::absolute(p, ec);
    std::string s = path.lexically_normal().string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return s;
  };
  return normal(a) == normal(b);
}

absl::Status RepairCheckpointDir(const std::string& dir) {
  MCC_ASSIGN_OR_RETURN(const std::vector<std::string> names, EntryNames(dir));
  for (const std::string& name : names) {
    const std::string path = file_util::JoinPath(dir, name);
    if (IterationOf(name, kTmpSuffix).has_value() ||
        name == absl::StrCat(kLatestFileName, kTmpSuffix)) {
      LOG(INFO) << "removing " << path << ", left by a save that died";
      MCC_RETURN_IF_ERROR(file_util::RemoveAll(path));
      continue;
    }
    const std::optional<int64_t> it = IterationOf(name, kOldSuffix);
    if (!it.has_value()) continue;
    const std::string current = file_util::JoinPath(dir, IterationDirName(*it));
    if (IsComplete(current)) {
      LOG(INFO) << "removing " << path << ": " << current
                << " replaced it (a re-save did not get to remove it)";
      MCC_RETURN_IF_ERROR(file_util::RemoveAll(path));
    } else if (!file_util::Exists(current) && IsComplete(path)) {
      LOG(WARNING) << "restoring " << current << " from " << path
                   << ": a re-save of iteration " << *it
                   << " died between moving it aside and renaming the new "
                      "copy in";
      MCC_RETURN_IF_ERROR(file_util::Rename(path, current));
      MCC_RETURN_IF_ERROR(file_util::FsyncDir(dir));
    }
  }
  return absl::OkStatus();
}

}  // namespace mcc
