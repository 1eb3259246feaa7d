#include "checkpoint/local_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/checkpoint_writer.h"
#include "core/crc32c.h"
#include "checkpoint/file_util.h"
#include "checkpoint/local_checkpoint.pb.h"
#include "core/checked_math.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace {

using checkpoint::LocalCopy;
using checkpoint::LocalInventory;

constexpr char kChecksumHeader[] = "mcc-local-checkpoint 1";
constexpr char kRankKey[] = "local_checkpoint.rank";
constexpr char kWorldKey[] = "local_checkpoint.world_size";

std::string RankDirName(int rank) { return absl::StrFormat("rank_%05d", rank); }

std::string ChecksumPath(const std::string& dir, int64_t iteration) {
  return file_util::JoinPath(dir, IterationDirName(iteration) + ".crc");
}

std::string CopyPath(const std::string& dir, int64_t iteration) {
  return file_util::JoinPath(dir, IterationDirName(iteration));
}

// The regular files of dir, by name.
std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    if (it->is_regular_file(ec)) {
      names.push_back(it->path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

struct ListedFile {
  std::string name;
  int64_t size = 0;
  uint32_t crc = 0;
};

std::string FormatChecksums(const std::vector<ListedFile>& files) {
  std::string out = absl::StrCat(kChecksumHeader, "\n");
  for (const ListedFile& f : files) {
    absl::StrAppend(&out, f.name, " ", f.size, " ", f.crc, "\n");
  }
  return out;
}

absl::StatusOr<std::vector<ListedFile>> ParseChecksums(
    const std::string& path, const std::string& text) {
  std::vector<std::string> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kChecksumHeader) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a local checkpoint checksum file"));
  }
  std::vector<ListedFile> files;
  for (size_t i = 1; i < lines.size(); ++i) {
    const std::vector<std::string> f = absl::StrSplit(lines[i], ' ');
    ListedFile file;
    uint32_t crc = 0;
    if (f.size() != 3 || f[0].empty() || f[0].find('/') != std::string::npos ||
        f[0] == "." || f[0] == ".." || !absl::SimpleAtoi(f[1], &file.size) ||
        file.size < 0 || !absl::SimpleAtoi(f[2], &crc)) {
      return absl::DataLossError(
          absl::StrCat(path, ": line ", i + 1, " is corrupt"));
    }
    file.name = f[0];
    file.crc = crc;
    files.push_back(std::move(file));
  }
  return files;
}

// Lists dir/iter_N's files with their sizes and CRC32Cs in dir/iter_N.crc
// (write-then-rename): the copy is complete from then on.
absl::Status WriteChecksumFile(const std::string& dir, int64_t iteration) {
  const std::string copy = CopyPath(dir, iteration);
  std::vector<ListedFile> files;
  for (const std::string& name : FilesIn(copy)) {
    MCC_ASSIGN_OR_RETURN(
        std::string bytes,
        file_util::ReadFileToString(file_util::JoinPath(copy, name)));
    files.push_back({name, static_cast<int64_t>(bytes.size()),
                     Crc32c(bytes.data(), bytes.size())});
  }
  return file_util::WriteFileAtomically(ChecksumPath(dir, iteration),
                                        FormatChecksums(files));
}

// The files of a verified copy, read back whole.
absl::StatusOr<LocalCopy> ReadCopy(const std::string& dir, int64_t iteration,
                                   int rank) {
  const std::string sums = ChecksumPath(dir, iteration);
  MCC_ASSIGN_OR_RETURN(std::string text, file_util::ReadFileToString(sums));
  MCC_ASSIGN_OR_RETURN(std::vector<ListedFile> files,
                       ParseChecksums(sums, text));
  LocalCopy copy;
  copy.set_rank(rank);
  copy.set_iteration(iteration);
  for (const ListedFile& f : files) {
    const std::string path =
        file_util::JoinPath(CopyPath(dir, iteration), f.name);
    MCC_ASSIGN_OR_RETURN(std::string bytes, file_util::ReadFileToString(path));
    if (static_cast<int64_t>(bytes.size()) != f.size ||
        Crc32c(bytes.data(), bytes.size()) != f.crc) {
      return absl::DataLossError(
          absl::StrCat(path, " does not match its size and CRC32C in ", sums,
                       " (torn or corrupt)"));
    }
    LocalCopy::File* file = copy.add_files();
    file->set_name(f.name);
    file->set_contents(std::move(bytes));
    file->set_crc32c(f.crc);
  }
  return copy;
}

// Writes a copy received from a peer as dir/iter_N (a temporary directory
// renamed in, then the checksum file), after checking every file's CRC.
absl::Status WriteCopy(const std::string& dir, const LocalCopy& copy,
                       int from_rank) {
  std::vector<ListedFile> files;
  for (const LocalCopy::File& f : copy.files()) {
    if (f.name().empty() || f.name().find('/') != std::string::npos ||
        f.name() == "." || f.name() == "..") {
      return absl::DataLossError(absl::StrCat("the copy rank ", from_rank,
                                              " sent names bad file \"",
                                              f.name(), "\""));
    }
    if (Crc32c(f.contents().data(), f.contents().size()) != f.crc32c()) {
      return absl::DataLossError(absl::StrCat(
          "the copy of ", f.name(), " (iteration ", copy.iteration(),
          " of rank ", copy.rank(), ") that rank ", from_rank,
          " sent does not match its CRC32C"));
    }
    files.push_back(
        {f.name(), static_cast<int64_t>(f.contents().size()), f.crc32c()});
  }
  const std::string final_dir = CopyPath(dir, copy.iteration());
  const std::string tmp_dir = final_dir + ".tmp";
  MCC_RETURN_IF_ERROR(file_util::MakeDirs(dir));
  MCC_RETURN_IF_ERROR(
      file_util::RemoveAll(ChecksumPath(dir, copy.iteration())));
  MCC_RETURN_IF_ERROR(file_util::RemoveAll(tmp_dir));
  MCC_RETURN_IF_ERROR(file_util::MakeDirs(tmp_dir));
  for (const LocalCopy::File& f : copy.files()) {
    MCC_ASSIGN_OR_RETURN(auto out, file_util::WritableFile::Create(
                                       file_util::JoinPath(tmp_dir, f.name())));
    MCC_RETURN_IF_ERROR(out.Append(f.contents().data(), f.contents().size()));
    MCC_RETURN_IF_ERROR(out.Close());
  }
  MCC_RETURN_IF_ERROR(file_util::FsyncDir(tmp_dir));
  MCC_RETURN_IF_ERROR(file_util::RemoveAll(final_dir));
  MCC_RETURN_IF_ERROR(file_util::Rename(tmp_dir, final_dir));
  MCC_RETURN_IF_ERROR(file_util::FsyncDir(dir));
  return file_util::WriteFileAtomically(ChecksumPath(dir, copy.iteration()),
                                        FormatChecksums(files));
}

// Keeps the newest `keep` copies in dir; removes the rest, checksum files
// left without their copy, and temporaries a killed write left.
void Prune(const std::string& dir, int keep) {
  std::vector<int64_t> all = ListCheckpoints(dir);
  std::set<std::string> kept;
  for (size_t i = 0; i < all.size(); ++i) {
    if (keep > 0 && i + keep < all.size()) {
      (void)file_util::RemoveAll(ChecksumPath(dir, all[i]));
      (void)file_util::RemoveAll(CopyPath(dir, all[i]));
    } else {
      kept.insert(IterationDirName(all[i]) + ".crc");
    }
  }
  for (const std::string& name : FilesIn(dir)) {
    const bool checksum = absl::EndsWith(name, ".crc");
    const bool temporary = absl::EndsWith(name, ".crc.tmp");
    if ((checksum && kept.count(name) == 0) || temporary) {
      (void)file_util::RemoveAll(file_util::JoinPath(dir, name));
    }
  }
}

// Verified copies in dir, newest first; refusals are logged and appended.
std::vector<int64_t> VerifiedCopies(const std::string& dir, int rank,
                                    int world_size,
                                    std::vector<std::string>* refused) {
  std::vector<int64_t> good;
  std::vector<int64_t> all = ListCheckpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    absl::Status s = VerifyLocalCopy(dir, *it, rank, world_size);
    if (s.ok()) {
      good.push_back(*it);
    } else {
      LOG(WARNING) << "local checkpoint refused: " << s.message();
      refused->push_back(std::string(s.message()));
    }
  }
  return good;
}

std::string EncodeStatus(const absl::Status& s) {
  return s.ok() ? std::string() : std::string(s.message());
}

// Every rank's status after a collective step: the first failure (naming
// its rank), the same on every rank.
absl::Status Agree(const DistContext& dist, const absl::Status& mine,
                   absl::string_view stage) {
  MCC_ASSIGN_OR_RETURN(std::vector<std::string> all,
                       dist.all_gather(EncodeStatus(mine)));
  for (size_t r = 0; r < all.size(); ++r) {
    if (!all[r].empty()) {
      return absl::InternalError(absl::StrCat(
          "local checkpoint ", stage, " failed on rank ", r, ": ", all[r]));
    }
  }
  return absl::OkStatus();
}

bool Holds(const google::protobuf::RepeatedField<int64_t>& list, int64_t it) {
  return std::find(list.begin(), list.end(), it) != list.end();
}

}  // namespace

int LocalReplicaPeer(int rank, int world_size,
                     const LocalCheckpointOptions& options) {
  if (!options.replicate || world_size <= 1) return -1;
  int jump = options.replication_jump;
  if (jump <= 0) {
    jump = options.ranks_per_node > 0 && world_size > options.ranks_per_node
               ? options.ranks_per_node
               : 1;
  }
  if (jump % world_size == 0) return -1;
  return (rank + jump) % world_size;
}

absl::Status VerifyLocalCopy(const std::string& dir, int64_t iteration,
                             int rank, int world_size) {
  const std::string sums = ChecksumPath(dir, iteration);
  if (!file_util::Exists(sums)) {
    return absl::DataLossError(
        absl::StrCat(CopyPath(dir, iteration), " has no ", sums,
                     " (a save or copy that did not finish)"));
  }
  MCC_ASSIGN_OR_RETURN(LocalCopy copy, ReadCopy(dir, iteration, rank));
  const LocalCopy::File* meta_file = nullptr;
  for (const LocalCopy::File& f : copy.files()) {
    if (f.name() == kMetadataFileName) meta_file = &f;
  }
  const std::string meta_path =
      file_util::JoinPath(CopyPath(dir, iteration), kMetadataFileName);
  checkpoint::CheckpointMetadata meta;
  if (meta_file == nullptr || !meta.ParseFromString(meta_file->contents())) {
    return absl::DataLossError(
        absl::StrCat(meta_path, " is missing or corrupt"));
  }
  const auto& extra = meta.common().extra();
  const auto r = extra.find(kRankKey);
  const auto w = extra.find(kWorldKey);
  if (meta.iteration() != iteration || r == extra.end() || w == extra.end() ||
      r->second != std::to_string(rank) ||
      w->second != std::to_string(world_size)) {
    return absl::DataLossError(absl::StrCat(
        meta_path, " is not rank ", rank, " of ", world_size, " at iteration ",
        iteration, " (it says rank ", r == extra.end() ? "?" : r->second,
        " of ", w == extra.end() ? "?" : w->second, " at iteration ",
        meta.iteration(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LocalCheckpointer>> LocalCheckpointer::Create(
    LocalCheckpointOptions options, DistContext dist) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("local checkpoints need a directory");
  }
  if (options.keep < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("local checkpoints keep ", options.keep,
                     " iterations; at least 1 is needed"));
  }
  if (!dist.all_gather) {
    return absl::InvalidArgumentError("DistContext without all_gather");
  }
  if (LocalReplicaPeer(dist.rank, dist.world_size, options) >= 0 &&
      !dist.send_recv) {
    return absl::InvalidArgumentError(
        "local checkpoint replication needs a DistContext with send_recv");
  }
  return std::unique_ptr<LocalCheckpointer>(
      new LocalCheckpointer(std::move(options), std::move(dist)));
}

LocalCheckpointer::LocalCheckpointer(LocalCheckpointOptions options,
                                     DistContext dist)
    : options_(std::move(options)), dist_(std::move(dist)) {
  peer_ = LocalReplicaPeer(dist_.rank, dist_.world_size, options_);
  if (peer_ >= 0) {
    // The rank whose peer this rank is.
    for (int r = 0; r < dist_.world_size; ++r) {
      if (LocalReplicaPeer(r, dist_.world_size, options_) == dist_.rank) {
        source_ = r;
      }
    }
    replica_dir_ = file_util::JoinPath(
        options_.dir, absl::StrCat("replica_of_", RankDirName(source_)));
  }
  rank_dir_ = file_util::JoinPath(options_.dir, RankDirName(dist_.rank));
}

absl::Status LocalCheckpointer::DropNewerThan(int64_t iteration) {
  for (const std::string& dir : {rank_dir_, replica_dir_}) {
    if (dir.empty()) continue;
    for (int64_t it : ListCheckpoints(dir)) {
      if (it <= iteration) continue;
      MCC_RETURN_IF_ERROR(file_util::RemoveAll(ChecksumPath(dir, it)));
      MCC_RETURN_IF_ERROR(file_util::RemoveAll(CopyPath(dir, it)));
    }
  }
  return absl::OkStatus();
}

void LocalCheckpointer::Hook(absl::string_view event) const {
  if (options_.progress_hook) options_.progress_hook(event);
}

absl::Status LocalCheckpointer::Save(
    int64_t iteration, const std::vector<ShardedTensorRef>& tensors,
    const checkpoint::CommonState& common,
    const checkpoint::RankState& rank_state) {
  checkpoint::CommonState mine = common;
  (*mine.mutable_extra())[kRankKey] = std::to_string(dist_.rank);
  (*mine.mutable_extra())[kWorldKey] = std::to_string(dist_.world_size);
  // A re-save of an iteration is incomplete until its new checksums land.
  absl::Status saved = file_util::RemoveAll(ChecksumPath(rank_dir_, iteration));
  if (saved.ok()) {
    SaveOptions save_options;
    save_options.keep_last = options_.keep;
    save_options.partial = true;  // This rank's boxes only.
    save_options.chaos_kill = false;
    saved = SaveCheckpoint(rank_dir_, iteration, tensors, mine, rank_state,
                           DistContext::Single(), save_options);
  }
  if (saved.ok()) saved = WriteChecksumFile(rank_dir_, iteration);
  if (saved.ok()) {
    Prune(rank_dir_, options_.keep);
    Hook("saved");
  }
  MCC_RETURN_IF_ERROR(Agree(dist_, saved, "save"));
  if (peer_ < 0) return absl::OkStatus();
  return Replicate(iteration);
}

absl::Status LocalCheckpointer::Replicate(int64_t iteration) {
  // Every rank sends (empty when its own copy cannot be read back), so
  // that the exchange pairs up; the agreement below reports the failure.
  absl::StatusOr<LocalCopy> copy = ReadCopy(rank_dir_, iteration, dist_.rank);
  absl::StatusOr<std::string> received =
      dist_.send_recv(copy.ok() ? copy->SerializeAsString() : std::string(),
                      peer_, source_, options_.max_copy_bytes);
  if (!received.ok()) return received.status();
  LocalCopy theirs;
  absl::Status kept = copy.status();
  if (!kept.ok()) {
    // Reported as this rank's failure.
  } else if (!theirs.ParseFromString(*received) || theirs.rank() != source_ ||
             theirs.iteration() != iteration) {
    kept = absl::DataLossError(
        absl::StrCat("the copy rank ", source_, " sent of iteration ",
                     iteration, " is corrupt or of another rank or iteration"));
  } else {
    kept = WriteCopy(replica_dir_, theirs, source_);
  }
  if (kept.ok()) {
    Prune(replica_dir_, options_.keep);
    Hook("replicated");
  }
  return Agree(dist_, kept, "replication");
}

absl::StatusOr<std::optional<LocalRestore>> LocalCheckpointer::PrepareRestore(
    std::optional<int64_t> persistent_iteration) {
  LocalRestore out;
  out.dir = rank_dir_;
  LocalInventory mine;
  for (int64_t it :
       VerifiedCopies(rank_dir_, dist_.rank, dist_.world_size, &out.refused)) {
    mine.add_own(it);
  }
  if (!replica_dir_.empty()) {
    for (int64_t it : VerifiedCopies(replica_dir_, source_, dist_.world_size,
                                     &out.refused)) {
      mine.add_held(it);
    }
  }
  MCC_ASSIGN_OR_RETURN(std::vector<std::string> gathered,
                       dist_.all_gather(mine.SerializeAsString()));
  const int n = dist_.world_size;
  std::vector<LocalInventory> inv(n);
  for (int r = 0; r < n; ++r) {
    if (!inv[r].ParseFromString(gathered[r])) {
      return absl::DataLossError(absl::StrCat("local checkpoint restore: rank ",
                                              r, "'s inventory is corrupt"));
    }
  }
  // Rank r can restore `it` from its own copy or from its peer's.
  auto restorable = [&](int r, int64_t it) {
    if (Holds(inv[r].own(), it)) return true;
    const int p = LocalReplicaPeer(r, n, options_);
    return p >= 0 && Holds(inv[p].held(), it);
  };
  std::set<int64_t> candidates;
  for (const LocalInventory& i : inv) {
    candidates.insert(i.own().begin(), i.own().end());
    candidates.insert(i.held().begin(), i.held().end());
  }
  std::optional<int64_t> chosen;
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    bool everyone = true;
    for (int r = 0; r < n && everyone; ++r) everyone = restorable(r, *it);
    if (everyone) {
      chosen = *it;
      break;
    }
  }
  const bool log = dist_.rank == 0;
  // The run resumes from the shared directory (or from scratch): copies
  // newer than that belong to a past the run will not follow, and would
  // hold on to the slots of the ones it saves.
  auto shared_instead = [&]() -> absl::StatusOr<std::optional<LocalRestore>> {
    if (absl::Status s = DropNewerThan(persistent_iteration.value_or(0));
        !s.ok()) {
      LOG(WARNING) << "local checkpoints: " << s;
    }
    return std::optional<LocalRestore>();
  };
  if (!chosen.has_value()) {
    LOG_IF(INFO, log) << "no local checkpoint that every rank can restore"
                      << (candidates.empty() ? " (none saved)" : "");
    return shared_instead();
  }
  if (persistent_iteration.has_value() && *chosen < *persistent_iteration) {
    LOG_IF(INFO, log) << "the newest local checkpoint (iteration " << *chosen
                      << ") is older than the shared one (iteration "
                      << *persistent_iteration << "): loading the shared one";
    return shared_instead();
  }
  out.iteration = *chosen;

  // Copies go back from the peers to the ranks that lost theirs.
  std::vector<int> lost;
  for (int r = 0; r < n; ++r) {
    if (!Holds(inv[r].own(), *chosen)) lost.push_back(r);
  }
  absl::Status ready;
  if (!lost.empty()) {
    const bool source_lost =
        source_ >= 0 && !Holds(inv[source_].own(), *chosen);
    std::string send;
    if (source_lost) {
      absl::StatusOr<LocalCopy> copy = ReadCopy(replica_dir_, *chosen, source_);
      // Verified a moment ago; if it changed since, the receiver fails.
      if (copy.ok()) send = copy->SerializeAsString();
    }
    absl::StatusOr<std::string> received = dist_.send_recv(
        send, source_ >= 0 ? source_ : dist_.rank,
        peer_ >= 0 ? peer_ : dist_.rank, options_.max_copy_bytes);
    if (!received.ok()) return received.status();
    if (!Holds(mine.own(), *chosen)) {
      LocalCopy copy;
      if (!copy.ParseFromString(*received) || copy.rank() != dist_.rank ||
          copy.iteration() != *chosen) {
        ready = absl::DataLossError(absl::StrCat(
            "the copy of iteration ", *chosen, " that rank ", peer_,
            " sent back is corrupt or of another rank or iteration"));
      } else {
        ready = WriteCopy(rank_dir_, copy, peer_);
      }
      if (ready.ok()) {
        ready = VerifyLocalCopy(rank_dir_, *chosen, dist_.rank, n);
      }
      out.from_peer = true;
      LOG(INFO) << "rank " << dist_.rank << ": fetched local checkpoint "
                << "iteration " << *chosen << " from rank " << peer_;
    }
  }
  if (ready.ok()) ready = DropNewerThan(*chosen);
  if (ready.ok()) {
    ready = file_util::WriteFileAtomically(
        file_util::JoinPath(rank_dir_, kLatestFileName),
        absl::StrCat(*chosen, "\n"));
  }
  if (absl::Status agreed = Agree(dist_, ready, "restore"); !agreed.ok()) {
    LOG_IF(WARNING, log) << agreed.message() << "; loading the shared one";
    return shared_instead();
  }
  LOG_IF(INFO, log) << "resuming from local checkpoints of iteration "
                    << *chosen << " (" << lost.size()
                    << " ranks fetched theirs from their peers)";
  return std::optional<LocalRestore>(std::move(out));
}

}  // namespace mcc
