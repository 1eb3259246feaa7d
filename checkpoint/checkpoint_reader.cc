#include "checkpoint/checkpoint_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/file_util.h"
#include "checkpoint/region.h"
#include "core/checked_math.h"
#include "core/crc32c.h"
#include "core/status_macros.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"

namespace mcc {
namespace {

using checkpoint::ShardRecord;
using checkpoint::TensorRecord;

Shape ToShape(const google::protobuf::RepeatedField<int64_t>& f) {
  return Shape(f.begin(), f.end());
}

bool ValidDType(int d) { return d >= 0 && d <= static_cast<int>(DType::kInt8); }

}  // namespace

CheckpointReader::~CheckpointReader() {
  for (auto& [name, fd] : fds_) ::close(fd);
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& dir, std::optional<int64_t> iteration) {
  CheckpointLocation loc;
  if (iteration.has_value()) {
    MCC_ASSIGN_OR_RETURN(loc, LocateCheckpoint(dir, *iteration));
  } else {
    auto found = FindCheckpointToLoad(dir);
    if (!found.ok()) {
      return absl::Status(found.status().code(),
                          absl::StrCat("no checkpoint to load in ", dir, ": ",
                                       found.status().message()));
    }
    if (!found->has_value()) {
      return absl::NotFoundError(absl::StrCat(
          "no checkpoint to load in ", dir, ": ",
          file_util::JoinPath(dir, kLatestFileName), " does not exist"));
    }
    loc = **found;
  }
  const int64_t it = loc.iteration;
  std::unique_ptr<CheckpointReader> r(new CheckpointReader());
  r->path_ = loc.path;
  const std::string meta_path =
      file_util::JoinPath(r->path_, kMetadataFileName);
  auto bytes = file_util::ReadFileToString(meta_path);
  if (!bytes.ok()) {
    return absl::Status(
        bytes.status().code(),
        absl::StrCat("checkpoint of iteration ", it, " in ", dir,
                     " is missing or incomplete: ", bytes.status().message()));
  }
  if (!r->metadata_.ParseFromString(*bytes)) {
    return absl::DataLossError(
        absl::StrCat(meta_path, " is not a valid CheckpointMetadata"));
  }
  if (r->metadata_.format_version() != kFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        meta_path, " has format version ", r->metadata_.format_version(),
        "; this build reads version ", kFormatVersion));
  }
  if (r->metadata_.iteration() != it) {
    return absl::DataLossError(absl::StrCat(meta_path, " records iteration ",
                                            r->metadata_.iteration()));
  }
  for (int i = 0; i < r->metadata_.tensors_size(); ++i) {
    r->index_[r->metadata_.tensors(i).name()] = i;
  }
  MCC_RETURN_IF_ERROR(r->Validate());
  return r;
}

absl::Status CheckpointReader::Validate() const {
  for (const TensorRecord& t : metadata_.tensors()) {
    if (!ValidDType(t.dtype())) {
      return absl::DataLossError(absl::StrCat(
          path_, ": tensor ", t.name(), " has unknown dtype ", t.dtype()));
    }
    const Shape g = ToShape(t.global_shape());
    const size_t esize = DTypeSize(static_cast<DType>(t.dtype()));
    // Extents and byte counts that int64 holds, so that no size, offset or
    // shard arithmetic below (or in ReadRegion) can overflow.
    int64_t max_elements = std::numeric_limits<int64_t>::max() / esize;
    for (int64_t d : g) {
      if (d < 0 || (d > 0 && max_elements / d == 0)) {
        return absl::DataLossError(
            absl::StrCat(path_, ": tensor ", t.name(), " has global shape ",
                         ShapeToString(g),
                         " (a negative extent, or more bytes than int64 "
                         "can count)"));
      }
      if (d > 0) max_elements /= d;
    }
    for (const ShardRecord& s : t.shards()) {
      const Box b{ToShape(s.global_offsets()), ToShape(s.local_shape())};
      bool inside = b.offsets.size() == g.size() && b.shape.size() == g.size();
      for (size_t d = 0; inside && d < g.size(); ++d) {
        inside = b.offsets[d] >= 0 && b.shape[d] >= 0 && b.shape[d] <= g[d] &&
                 b.offsets[d] <= g[d] - b.shape[d];
      }
      if (!inside ||
          s.byte_offset() >
              static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) -
                  s.byte_length()) {
        return absl::DataLossError(absl::StrCat(
            path_, ": tensor ", t.name(), " ", ShapeToString(g), " has shard ",
            ShapeToString(b.offsets), " + ", ShapeToString(b.shape),
            " at byte ", s.byte_offset(), " of ", s.file(), " outside it"));
      }
      if (s.byte_length() != static_cast<uint64_t>(b.NumElements()) * esize) {
        return absl::DataLossError(
            absl::StrCat(path_, ": tensor ", t.name(), " shard ", b.ToString(),
                         " in ", s.file(), " has ", s.byte_length(),
                         " bytes, expected ", b.NumElements() * esize));
      }
      if (s.file().empty() || s.file().find('/') != std::string::npos) {
        return absl::DataLossError(absl::StrCat(path_, ": tensor ", t.name(),
                                                " names bad file \"", s.file(),
                                                "\""));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<checkpoint::RankState> CheckpointReader::RankStateOf(
    int rank) const {
  for (const auto& r : metadata_.ranks()) {
    if (r.rank() == rank) return r;
  }
  return absl::NotFoundError(absl::StrCat(path_, " holds no state of rank ",
                                          rank, " (saved by ",
                                          metadata_.world_size(), " ranks)"));
}

std::vector<std::string> CheckpointReader::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& t : metadata_.tensors()) names.push_back(t.name());
  return names;
}

absl::StatusOr<const TensorRecord*> CheckpointReader::FindTensor(
    absl::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor ", name, " is not in checkpoint ", path_));
  }
  return &metadata_.tensors(it->second);
}

absl::StatusOr<int> CheckpointReader::FileFor(const std::string& file,
                                              absl::string_view tensor) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = fds_.find(file);
  if (it != fds_.end()) return it->second;
  const std::string path = file_util::JoinPath(path_, file);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string msg =
        absl::StrCat("cannot open shard file ", path, " of tensor ", tensor,
                     ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(msg) : absl::InternalError(msg);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat("cannot stat shard file ", path,
                                            ": ", std::strerror(err)));
  }
  fds_[file] = fd;
  file_sizes_[file] = static_cast<int64_t>(st.st_size);
  return fd;
}

absl::StatusOr<int64_t> CheckpointReader::FileSize(const std::string& file,
                                                   absl::string_view tensor) {
  MCC_RETURN_IF_ERROR(FileFor(file, tensor).status());
  std::lock_guard<std::mutex> lock(mu_);
  return file_sizes_.at(file);
}

absl::StatusOr<int64_t> CheckpointReader::ShardFileBytes() {
  std::set<std::string> seen;
  int64_t total = 0;
  for (const TensorRecord& t : metadata_.tensors()) {
    for (const ShardRecord& s : t.shards()) {
      if (!seen.insert(s.file()).second) continue;
      MCC_ASSIGN_OR_RETURN(const int64_t size, FileSize(s.file(), t.name()));
      // Sizes of real files: their sum stays far inside int64.
      total += size;
    }
  }
  return total;
}

absl::Status CheckpointReader::CheckShardInFile(const TensorRecord& t,
                                                const ShardRecord& s) {
  MCC_ASSIGN_OR_RETURN(const int64_t file_size, FileSize(s.file(), t.name()));
  // Validate() keeps offset + length within int64. The file's size bounds
  // what is read, whatever metadata.pb claims.
  if (s.byte_offset() + s.byte_length() > static_cast<uint64_t>(file_size)) {
    const Box b{ToShape(s.global_offsets()), ToShape(s.local_shape())};
    return absl::DataLossError(absl::StrCat(
        "shard file ", file_util::JoinPath(path_, s.file()),
        " is truncated: tensor ", t.name(), " shard ", b.ToString(),
        " needs bytes [", s.byte_offset(), ", ",
        s.byte_offset() + s.byte_length(), ") but the file has ", file_size));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadShard(const TensorRecord& t,
                                         const ShardRecord& s,
                                         std::string* buf) {
  MCC_ASSIGN_OR_RETURN(int fd, FileFor(s.file(), t.name()));
  MCC_RETURN_IF_ERROR(CheckShardInFile(t, s));
  const std::string path = file_util::JoinPath(path_, s.file());
  const Box b{ToShape(s.global_offsets()), ToShape(s.local_shape())};
  buf->resize(s.byte_length());
  uint64_t done = 0;
  while (done < s.byte_length()) {
    const ssize_t r = ::pread(fd, buf->data() + done, s.byte_length() - done,
                              s.byte_offset() + done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      return absl::InternalError(
          absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (r == 0) {
      return absl::DataLossError(absl::StrCat(
          "shard file ", path, " is truncated: tensor ", t.name(), " shard ",
          b.ToString(), " needs bytes [", s.byte_offset(), ", ",
          s.byte_offset() + s.byte_length(), ")"));
    }
    done += r;
  }
  const uint32_t crc = Crc32c(buf->data(), buf->size());
  if (crc != s.crc32c()) {
    return absl::DataLossError(absl::StrFormat(
        "checksum mismatch in %s: tensor %s shard %s (bytes %d..%d): stored "
        "CRC32C 0x%08x, computed 0x%08x",
        path, t.name(), b.ToString(), s.byte_offset(),
        s.byte_offset() + s.byte_length(), s.crc32c(), crc));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadRegion(
    absl::string_view name, absl::Span<const int64_t> global_offsets,
    Tensor* out) {
  MCC_ASSIGN_OR_RETURN(const TensorRecord* t, FindTensor(name));
  if (out == nullptr || !out->defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ReadRegion(", name, "): output tensor is undefined"));
  }
  if (!out->device().is_cpu()) {
    Tensor host = Tensor::Empty(out->shape(), out->dtype());
    MCC_RETURN_IF_ERROR(ReadRegion(name, global_offsets, &host));
    return out->CopyFrom(host);
  }
  const Shape g = ToShape(t->global_shape());
  const Box want{Shape(global_offsets.begin(), global_offsets.end()),
                 out->shape()};
  if (want.offsets.size() != g.size() || want.shape.size() != g.size() ||
      !Contains(Box{Shape(g.size(), 0), g}, want)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReadRegion(", name, "): region ", ShapeToString(want.offsets), " + ",
        ShapeToString(want.shape), " is not inside the stored global shape ",
        ShapeToString(g)));
  }
  const DType src_dtype = static_cast<DType>(t->dtype());
  const size_t src_size = DTypeSize(src_dtype);
  const size_t dst_size = DTypeSize(out->dtype());
  char* dst = static_cast<char*>(out->raw_data());
  int64_t filled = 0;
  for (const ShardRecord& s : t->shards()) {
    const Box sb{ToShape(s.global_offsets()), ToShape(s.local_shape())};
    if (Intersect(sb, want).Empty()) continue;
    // The last shard read stays cached, verified: reading a shard's column
    // blocks one after another reads and checks it once. The key holds
    // everything that decides the bytes and their check: two records at the
    // same offset with other lengths (a damaged or hostile metadata file;
    // found by the checkpoint_metadata fuzzer) must not share a buffer.
    const std::string key = absl::StrCat(s.file(), ":", s.byte_offset(), ":",
                                         s.byte_length(), ":", s.crc32c());
    if (key != cache_key_) {
      cache_key_.clear();
      MCC_RETURN_IF_ERROR(ReadShard(*t, s, &cache_));
      cache_key_ = key;
    }
    const std::string& buf = cache_;
    ForEachOverlapRun(sb, want, [&](int64_t si, int64_t di, int64_t n) {
      if (src_dtype == out->dtype()) {
        std::memcpy(dst + di * dst_size, buf.data() + si * src_size,
                    n * src_size);
      } else {
        ConvertElements(buf.data() + si * src_size, src_dtype,
                        dst + di * dst_size, out->dtype(), n);
      }
      filled += n;
    });
  }
  if (filled != want.NumElements()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", path_, ": the stored shards of tensor ", name,
        " cover only ", filled, " of the ", want.NumElements(),
        " elements of region ", want.ToString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CheckpointReader::ReadTensor(absl::string_view name) {
  MCC_ASSIGN_OR_RETURN(const TensorRecord* t, FindTensor(name));
  // The tensor's bytes (int64 holds them: Validate) must be on disk, in the
  // files its shards name, before they are allocated.
  const DType dtype = static_cast<DType>(t->dtype());
  const Shape shape = ToShape(t->global_shape());
  const int64_t want = NumElements(shape) * DTypeSize(dtype);
  if (want > 0) {
    std::map<std::string, int64_t> files;
    for (const ShardRecord& s : t->shards()) {
      MCC_RETURN_IF_ERROR(CheckShardInFile(*t, s));
      MCC_ASSIGN_OR_RETURN(files[s.file()], FileSize(s.file(), t->name()));
    }
    int64_t on_disk = 0;
    for (const auto& [file, size] : files) {
      on_disk = CheckedAdd(on_disk, size).value_or(on_disk);
    }
    if (on_disk < want) {
      std::vector<std::string> names;
      for (const auto& [file, size] : files) names.push_back(file);
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", path_, ": tensor ", name, " ", ShapeToString(shape),
          " needs ", want, " bytes but its shard files (",
          names.empty() ? "none" : absl::StrJoin(names, ", "), ") hold ",
          on_disk));
    }
  }
  Tensor out = Tensor::Empty(shape, dtype);
  MCC_RETURN_IF_ERROR(ReadRegion(name, Shape(t->global_shape_size(), 0), &out));
  return out;
}

absl::Status CheckpointReader::Load(const std::vector<ShardedTensorRef>& refs) {
  for (const ShardedTensorRef& ref : refs) {
    MCC_RETURN_IF_ERROR(ref.Validate());
    MCC_ASSIGN_OR_RETURN(const TensorRecord* t, FindTensor(ref.name));
    const Shape g = ToShape(t->global_shape());
    if (g != ref.global_shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor ", ref.name, ": checkpoint ", path_, " stores global shape ",
          ShapeToString(g), " but the model expects ",
          ShapeToString(ref.global_shape),
          " (does the model configuration match the checkpoint's?)"));
    }
    Tensor local = ref.local;
    MCC_RETURN_IF_ERROR(ReadRegion(ref.name, ref.global_offsets, &local));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::CheckModelConfig(
    const checkpoint::ModelConfig& run_config) const {
  // An unset vocab_size (older writers) means the padded one.
  auto vocab = [](checkpoint::ModelConfig c) {
    if (c.vocab_size() == 0) c.set_vocab_size(c.padded_vocab_size());
    return c;
  };
  const checkpoint::ModelConfig saved = vocab(metadata_.common().model());
  const checkpoint::ModelConfig run = vocab(run_config);
  const auto* desc = saved.GetDescriptor();
  const auto* refl = saved.GetReflection();
  std::vector<std::string> diffs;
  for (int i = 0; i < desc->field_count(); ++i) {
    const auto* field = desc->field(i);
    if (field->name() == "padded_vocab_size" || field->name() == "seq_length") {
      continue;
    }
    if (field->name() == "max_position_embeddings" &&
        saved.position_embedding_type() ==
            checkpoint::POSITION_EMBEDDING_ROPE &&
        run.position_embedding_type() == checkpoint::POSITION_EMBEDDING_ROPE) {
      continue;
    }
    std::string a, b;
    google::protobuf::TextFormat::PrintFieldValueToString(saved, field, -1, &a);
    google::protobuf::TextFormat::PrintFieldValueToString(run, field, -1, &b);
    if (a != b) {
      diffs.push_back(
          absl::StrCat(field->name(), ": checkpoint ", a, ", run ", b));
    }
  }
  (void)refl;
  if (diffs.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("model configuration of checkpoint ", path_,
                   " differs from this run's: ", absl::StrJoin(diffs, "; ")));
}

int64_t StoredVocabRows(const checkpoint::ModelConfig& config) {
  return std::max(config.vocab_size(), config.padded_vocab_size());
}

}  // namespace mcc
