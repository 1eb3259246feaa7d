#include "checkpoint/checkpoint_writer.h"

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/file_util.h"
#include "checkpoint/save_plan.h"
#include "core/crc32c.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace {

using checkpoint::CheckpointMetadata;
using checkpoint::RankManifest;
using checkpoint::ShardRecord;
using checkpoint::TensorRecord;

std::string BoxKey(const std::string& name, absl::Span<const int64_t> offsets,
                   absl::Span<const int64_t> shape) {
  return absl::StrCat(name, "|", ShapeToString(offsets), "|",
                      ShapeToString(shape));
}

std::string EncodeStatus(const absl::Status& s) {
  if (s.ok()) return std::string();
  return absl::StrCat(static_cast<int>(s.code()), "|", s.message());
}

absl::Status DecodeStatus(absl::string_view stage, size_t rank,
                          const std::string& m) {
  const std::vector<std::string> parts =
      absl::StrSplit(m, absl::MaxSplits('|', 1));
  int code = static_cast<int>(absl::StatusCode::kUnknown);
  if (parts.size() == 2) (void)absl::SimpleAtoi(parts[0], &code);
  return absl::Status(
      static_cast<absl::StatusCode>(code),
      absl::StrCat("checkpoint save (", stage, ") failed on rank ", rank, ": ",
                   parts.back()));
}

// All ranks learn whether every rank succeeded; they all get the first
// failing rank's error, so they all take the same branch afterwards.
absl::Status AgreeOnStatus(const DistContext& dist, const absl::Status& mine,
                           absl::string_view stage) {
  auto all = dist.all_gather(EncodeStatus(mine));
  if (!all.ok()) {
    return absl::Status(all.status().code(),
                        absl::StrCat("checkpoint save (", stage,
                                     "): all-gather failed on rank ", dist.rank,
                                     ": ", all.status().message()));
  }
  for (size_t r = 0; r < all->size(); ++r) {
    if (!(*all)[r].empty()) return DecodeStatus(stage, r, (*all)[r]);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<RankManifest>> GatherManifests(
    const DistContext& dist, const RankManifest& mine,
    absl::string_view stage) {
  auto all = dist.all_gather(mine.SerializeAsString());
  if (!all.ok()) {
    return absl::Status(all.status().code(),
                        absl::StrCat("checkpoint save (", stage,
                                     "): all-gather failed on rank ", dist.rank,
                                     ": ", all.status().message()));
  }
  std::vector<RankManifest> out(all->size());
  for (size_t r = 0; r < all->size(); ++r) {
    if (!out[r].ParseFromString((*all)[r])) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint save (", stage, "): rank ", r, "'s manifest is corrupt"));
    }
  }
  for (size_t r = 0; r < out.size(); ++r) {
    if (!out[r].error().empty()) return DecodeStatus(stage, r, out[r].error());
  }
  return out;
}

// Fault injection for the chaos benchmark (//tools/bench:chaos): with
// MCC_CHAOS_KILL_AT_SAVE=<event prefix> and MCC_CHAOS_KILL_RANK=<rank>, that
// rank kills itself (SIGKILL) at the first save event with that prefix.
// Read at every event (not cached), so that a forked test child can set it.
void ChaosKill(absl::string_view event) {
  const char* const at = std::getenv("MCC_CHAOS_KILL_AT_SAVE");
  if (at == nullptr || *at == '\0' || !absl::StartsWith(event, at)) return;
  const char* rank = std::getenv("RANK");
  const char* victim = std::getenv("MCC_CHAOS_KILL_RANK");
  if (victim != nullptr && (rank == nullptr || std::strcmp(rank, victim) != 0))
    return;
  raise(SIGKILL);
}

void Hook(const SaveOptions& options, absl::string_view event) {
  if (options.progress_hook) options.progress_hook(event);
  if (options.chaos_kill) ChaosKill(event);
}

// Writes the shards this rank was chosen for; returns their records.
absl::StatusOr<std::vector<TensorRecord>> WriteMyShards(
    const std::string& tmp_dir, const std::vector<PlannedShard>& plan,
    const std::map<std::string, const ShardedTensorRef*>& mine,
    const DistContext& dist, const SaveOptions& options) {
  std::vector<TensorRecord> records;
  const std::string file_name = ShardFileName(dist.rank);
  const std::string path = file_util::JoinPath(tmp_dir, file_name);
  std::optional<file_util::WritableFile> file;
  for (const PlannedShard& p : plan) {
    if (p.writer != dist.rank) continue;
    const ShardedTensorRef* ref = mine.at(BoxKey(p.name, p.offsets, p.shape));
    if (!file.has_value()) {
      MCC_ASSIGN_OR_RETURN(auto f, file_util::WritableFile::Create(path));
      file.emplace(std::move(f));
    }
    Tensor host = ref->local;
    if (!host.device().is_cpu()) {
      MCC_ASSIGN_OR_RETURN(host, ref->local.To(Device::CPU()));
    }
    MCC_RETURN_IF_ERROR(file->PadTo(options.alignment));
    const uint64_t offset = file->size();
    absl::Status s = file->Append(host.raw_data(), host.nbytes());
    if (!s.ok()) {
      return absl::Status(
          s.code(), absl::StrCat("tensor ", p.name, " shard ",
                                 ref->box().ToString(), ": ", s.message()));
    }
    TensorRecord rec;
    rec.set_name(p.name);
    for (int64_t d : ref->global_shape) rec.add_global_shape(d);
    rec.set_dtype(static_cast<checkpoint::DType>(host.dtype()));
    ShardRecord* shard = rec.add_shards();
    for (int64_t d : p.offsets) shard->add_global_offsets(d);
    for (int64_t d : p.shape) shard->add_local_shape(d);
    shard->set_file(file_name);
    shard->set_byte_offset(offset);
    shard->set_byte_length(host.nbytes());
    shard->set_crc32c(Crc32c(host.raw_data(), host.nbytes()));
    shard->set_writer_rank(dist.rank);
    records.push_back(std::move(rec));
    Hook(options, absl::StrCat("shard ", p.name));
  }
  if (file.has_value()) MCC_RETURN_IF_ERROR(file->Close());
  return records;
}

absl::Status CommitOnRank0(const std::string& dir, int64_t iteration,
                           const std::string& tmp_dir,
                           const std::vector<RankManifest>& written,
                           const checkpoint::CommonState& common,
                           const SaveOptions& options) {
  CheckpointMetadata meta;
  meta.set_format_version(kFormatVersion);
  meta.set_iteration(iteration);
  meta.set_world_size(static_cast<int>(written.size()));
  meta.set_created_unix_seconds(static_cast<int64_t>(std::time(nullptr)));
  *meta.mutable_common() = common;
  meta.mutable_common()->set_iteration(iteration);
  std::map<std::string, TensorRecord> by_name;
  for (const RankManifest& m : written) {
    *meta.add_ranks() = m.state();
    meta.mutable_ranks()->rbegin()->set_rank(m.rank());
    for (const TensorRecord& t : m.tensors()) {
      auto [it, inserted] = by_name.try_emplace(t.name());
      if (inserted) {
        it->second = t;
      } else {
        for (const ShardRecord& s : t.shards()) *it->second.add_shards() = s;
      }
    }
  }
  for (auto& [name, rec] : by_name) {
    std::sort(rec.mutable_shards()->begin(), rec.mutable_shards()->end(),
              [](const ShardRecord& a, const ShardRecord& b) {
                return std::vector<int64_t>(a.global_offsets().begin(),
                                            a.global_offsets().end()) <
                       std::vector<int64_t>(b.global_offsets().begin(),
                                            b.global_offsets().end());
              });
    *meta.add_tensors() = std::move(rec);
  }
  {
    const std::string path = file_util::JoinPath(tmp_dir, kMetadataFileName);
    MCC_ASSIGN_OR_RETURN(auto f, file_util::WritableFile::Create(path));
    const std::string bytes = meta.SerializeAsString();
    MCC_RETURN_IF_ERROR(f.Append(bytes.data(), bytes.size()));
    MCC_RETURN_IF_ERROR(f.Close());
  }
  MCC_RETURN_IF_ERROR(file_util::FsyncDir(tmp_dir));
  Hook(options, "metadata_written");

  const std::string final_dir =
      file_util::JoinPath(dir, IterationDirName(iteration));
  const std::string old_dir = final_dir + ".old";
  const bool replacing = file_util::Exists(final_dir);
  if (replacing) {
    // Saving an iteration again (a resumed run): move the old copy aside.
    // Dying from here until the rename below leaves it only as .old, which
    // the next load reads and the next load or save of the writer moves
    // back (RepairCheckpointDir).
    MCC_RETURN_IF_ERROR(file_util::RemoveAll(old_dir));
    MCC_RETURN_IF_ERROR(file_util::Rename(final_dir, old_dir));
  }
  absl::Status moved = replacing ? file_util::FsyncDir(dir) : absl::OkStatus();
  if (moved.ok()) {
    if (replacing) Hook(options, "old_moved_aside");
    Hook(options, "renaming");
    moved = file_util::Rename(tmp_dir, final_dir);
  }
  if (!moved.ok()) {
    // Put the old copy back (best effort: else the next start restores it).
    if (replacing) (void)file_util::Rename(old_dir, final_dir);
    return moved;
  }
  MCC_RETURN_IF_ERROR(file_util::FsyncDir(dir));
  if (replacing) MCC_RETURN_IF_ERROR(file_util::RemoveAll(old_dir));
  MCC_RETURN_IF_ERROR(
      file_util::WriteFileAtomically(file_util::JoinPath(dir, kLatestFileName),
                                     absl::StrCat(iteration, "\n")));
  Hook(options, "committed");

  if (options.keep_last > 0) {
    std::vector<int64_t> all = ListCheckpoints(dir);
    const int excess = static_cast<int>(all.size()) - options.keep_last;
    for (int i = 0; i < excess; ++i) {
      if (all[i] == iteration) continue;
      const std::string victim =
          file_util::JoinPath(dir, IterationDirName(all[i]));
      if (absl::Status s = file_util::RemoveAll(victim); !s.ok()) {
        LOG(WARNING) << "--keep-last: " << s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SaveCheckpoint(const std::string& dir, int64_t iteration,
                            const std::vector<ShardedTensorRef>& tensors,
                            const checkpoint::CommonState& common,
                            const checkpoint::RankState& rank_state,
                            const DistContext& dist,
                            const SaveOptions& options) {
  CHECK(dist.all_gather) << "DistContext without all_gather";
  const std::string tmp_dir =
      file_util::JoinPath(dir, IterationDirName(iteration) + ".tmp");

  // 1. Rank 0 prepares a fresh temporary directory.
  absl::Status prep;
  if (dist.rank == 0) {
    if (iteration < 0) {
      prep = absl::InvalidArgumentError(
          absl::StrCat("checkpoint iteration ", iteration, " is negative"));
    }
    if (prep.ok()) prep = file_util::MakeDirs(dir);
    // What a killed save left: temporaries, a re-save's .old. Safe here:
    // saves run one at a time (an async save waits for the previous one),
    // and only rank 0 of the one job saving into dir gets here.
    if (prep.ok()) prep = RepairCheckpointDir(dir);
    if (prep.ok()) prep = file_util::RemoveAll(tmp_dir);
    if (prep.ok()) prep = file_util::MakeDirs(tmp_dir);
  }
  MCC_RETURN_IF_ERROR(AgreeOnStatus(dist, prep, "prepare " + tmp_dir));

  // 2. Exchange what every rank holds; plan who writes what.
  RankManifest manifest;
  manifest.set_rank(dist.rank);
  *manifest.mutable_state() = rank_state;
  manifest.mutable_state()->set_rank(dist.rank);
  std::map<std::string, const ShardedTensorRef*> mine;
  for (const ShardedTensorRef& ref : tensors) {
    if (absl::Status s = ref.Validate(); !s.ok()) {
      manifest.set_error(EncodeStatus(s));
      break;
    }
    mine[BoxKey(ref.name, ref.global_offsets, ref.local.shape())] = &ref;
    TensorRecord* rec = manifest.add_tensors();
    rec->set_name(ref.name);
    for (int64_t d : ref.global_shape) rec->add_global_shape(d);
    rec->set_dtype(static_cast<checkpoint::DType>(ref.local.dtype()));
    ShardRecord* shard = rec->add_shards();
    for (int64_t d : ref.global_offsets) shard->add_global_offsets(d);
    for (int64_t d : ref.local.shape()) shard->add_local_shape(d);
  }
  auto cleanup_on_error = [&](absl::Status s) {
    if (!s.ok() && dist.rank == 0) (void)file_util::RemoveAll(tmp_dir);
    return s;
  };
  auto holdings = GatherManifests(dist, manifest, "exchange shard lists");
  if (!holdings.ok()) return cleanup_on_error(holdings.status());
  // Deterministic, so every rank fails or succeeds alike.
  auto plan = PlanSave(*holdings, /*require_cover=*/!options.partial);
  if (!plan.ok()) return cleanup_on_error(plan.status());

  // 3. Write and fsync this rank's shards.
  auto records = WriteMyShards(tmp_dir, *plan, mine, dist, options);
  RankManifest written;
  written.set_rank(dist.rank);
  *written.mutable_state() = manifest.state();
  if (records.ok()) {
    for (auto& r : *records) *written.add_tensors() = std::move(r);
  } else {
    written.set_error(EncodeStatus(records.status()));
  }
  // The all-gather is the barrier: every file is durable once it returns.
  auto all_written = GatherManifests(dist, written, "write shards");
  if (!all_written.ok()) return cleanup_on_error(all_written.status());
  Hook(options, "files_synced");

  // 4. Rank 0 commits: metadata, directory rename, latest file.
  absl::Status commit;
  if (dist.rank == 0) {
    commit =
        CommitOnRank0(dir, iteration, tmp_dir, *all_written, common, options);
  }
  return cleanup_on_error(AgreeOnStatus(dist, commit, "commit"));
}

}  // namespace mcc
