#include "data/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/file_system.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc::data {

size_t TokenDTypeSize(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
    case TokenDType::kInt8:
      return 1;
    case TokenDType::kInt16:
    case TokenDType::kUInt16:
      return 2;
    case TokenDType::kInt32:
    case TokenDType::kFloat32:
      return 4;
    case TokenDType::kInt64:
    case TokenDType::kFloat64:
      return 8;
  }
  return 0;
}

const char* TokenDTypeName(TokenDType dtype) {
  switch (dtype) {
    case TokenDType::kUInt8:
      return "uint8";
    case TokenDType::kInt8:
      return "int8";
    case TokenDType::kInt16:
      return "int16";
    case TokenDType::kInt32:
      return "int32";
    case TokenDType::kInt64:
      return "int64";
    case TokenDType::kFloat64:
      return "float64";
    case TokenDType::kFloat32:
      return "float32";
    case TokenDType::kUInt16:
      return "uint16";
  }
  return "?";
}

absl::StatusOr<TokenDType> TokenDTypeFromCode(uint8_t code) {
  if (code < 1 || code > 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown dtype code ", code, " (Megatron uses 1..8)"));
  }
  return static_cast<TokenDType>(code);
}

TokenDType OptimalTokenDType(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDType::kUInt16 : TokenDType::kInt32;
}

std::string BinPath(const std::string& prefix) { return prefix + ".bin"; }
std::string IdxPath(const std::string& prefix) { return prefix + ".idx"; }

// ---------------------------------------------------------------- MappedFile

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(
    const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    return absl::InternalError(
        absl::StrCat("cannot stat ", path, ": ", std::strerror(e)));
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<size_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("cannot mmap ", path, ": ", std::strerror(e)));
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// ------------------------------------------------------------ IndexedDataset

namespace {

template <typename T>
T ReadLE(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86-64 is little-endian, as the format.
  return v;
}

constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

// A token stored as a float, truncated as numpy's astype(int64) does; values
// no int64 holds (NaN, infinities, beyond 2^63) read as -1, an id that no
// vocabulary has, instead of undefined behaviour.
int64_t FloatToken(double v) {
  if (!(v > -9.2e18 && v < 9.2e18)) return -1;
  return static_cast<int64_t>(v);
}

}  // namespace

absl::StatusOr<std::unique_ptr<IndexedDataset>> IndexedDataset::Open(
    const std::string& prefix) {
  const std::string idx_path = IdxPath(prefix);
  auto idx_or = MappedFile::Open(idx_path);
  if (!idx_or.ok()) return idx_or.status();
  std::unique_ptr<MappedFile> idx = std::move(idx_or).value();
  std::unique_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->prefix_ = prefix;
  absl::Status s = ds->ParseIndex(absl::string_view(
      reinterpret_cast<const char*>(idx->data()), idx->size()));
  if (!s.ok()) return s;
  auto bin_or = MappedFile::Open(BinPath(prefix));
  if (!bin_or.ok()) return bin_or.status();
  ds->bin_ = std::move(bin_or).value();
  ds->bin_data_ = ds->bin_->data();
  ds->bin_size_ = ds->bin_->size();
  s = ds->ValidateAgainstBin();
  if (!s.ok()) return s;
  return ds;
}

absl::StatusOr<std::unique_ptr<IndexedDataset>> IndexedDataset::FromMemory(
    const std::string& prefix, absl::string_view idx, absl::string_view bin) {
  std::unique_ptr<IndexedDataset> ds(new IndexedDataset());
  ds->prefix_ = prefix;
  absl::Status s = ds->ParseIndex(idx);
  if (!s.ok()) return s;
  ds->bin_data_ = reinterpret_cast<const uint8_t*>(bin.data());
  ds->bin_size_ = bin.size();
  s = ds->ValidateAgainstBin();
  if (!s.ok()) return s;
  return ds;
}

absl::Status IndexedDataset::ParseIndex(absl::string_view idx) {
  const std::string idx_path = IdxPath(prefix_);
  const uint8_t* p = reinterpret_cast<const uint8_t*>(idx.data());
  const size_t n = idx.size();
  if (n < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(idx_path, ": truncated index: ", n,
                                            " bytes, the header alone needs ",
                                            kHeaderBytes));
  }
  if (std::memcmp(p, kIndexMagic, sizeof(kIndexMagic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        idx_path,
        ": wrong magic at byte offset 0 (expected \"MMIDIDX\\0\\0\"): not a "
        "Megatron MMIDIDX index"));
  }
  const uint64_t version = ReadLE<uint64_t>(p + 9);
  if (version != kIndexVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat(idx_path, ": unsupported index version ", version,
                     " at byte offset 9 (expected 1)"));
  }
  auto dtype_or = TokenDTypeFromCode(p[17]);
  if (!dtype_or.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        idx_path, ": byte offset 17: ", dtype_or.status().message()));
  }
  const uint64_t num_seq = ReadLE<uint64_t>(p + 18);
  const uint64_t num_doc = ReadLE<uint64_t>(p + 26);
  // Guard the size arithmetic against absurd counts.
  if (num_seq > n || num_doc > n) {
    return absl::DataLossError(absl::StrCat(
        idx_path, ": header claims ", num_seq, " sequences and ", num_doc,
        " document entries, more than a ", n, "-byte index can hold"));
  }
  const size_t need = kHeaderBytes + num_seq * 12 + num_doc * 8;
  if (n != need && n != need + num_seq) {
    return absl::DataLossError(absl::StrCat(
        idx_path, ": index is ", n, " bytes but its header (", num_seq,
        " sequences, ", num_doc, " document entries) needs ", need,
        n < need ? " (truncated)" : " (trailing bytes)"));
  }
  dtype_ = *dtype_or;
  lengths_.resize(num_seq);
  pointers_.resize(num_seq);
  document_indices_.resize(num_doc);
  size_t off = kHeaderBytes;
  if (num_seq > 0) std::memcpy(lengths_.data(), p + off, num_seq * 4);
  off += num_seq * 4;
  if (num_seq > 0) std::memcpy(pointers_.data(), p + off, num_seq * 8);
  off += num_seq * 8;
  if (num_doc > 0) std::memcpy(document_indices_.data(), p + off, num_doc * 8);
  return absl::OkStatus();
}

absl::Status IndexedDataset::ValidateAgainstBin() {
  const std::string idx_path = IdxPath(prefix_);
  const std::string bin_path = BinPath(prefix_);
  const uint64_t num_seq = lengths_.size();
  const uint64_t num_doc = document_indices_.size();
  const int64_t bin_size = static_cast<int64_t>(bin_size_);
  const int64_t item = static_cast<int64_t>(TokenDTypeSize(dtype_));

  int64_t total = 0;
  for (uint64_t i = 0; i < num_seq; ++i) {
    const int64_t len = lengths_[i];
    const int64_t ptr = pointers_[i];
    if (len < 0) {
      return absl::DataLossError(
          absl::StrCat(idx_path, ": sequence ", i, " has negative length ", len,
                       " (byte offset ", kHeaderBytes + 4 * i, ")"));
    }
    // Compared as bin_size - ptr so that no pointer can overflow the sum.
    if (ptr < 0 || ptr % item != 0 || ptr > bin_size ||
        len * item > bin_size - ptr) {
      const bool truncated =
          ptr >= 0 && ptr % item == 0 && ptr <= bin_size && i + 1 == num_seq;
      return absl::DataLossError(absl::StrCat(
          truncated ? bin_path : idx_path, ": ",
          truncated ? "truncated .bin: " : "index points past the end: ",
          "sequence ", i, " needs ", len * item, " bytes at byte ", ptr,
          " but ", bin_path, " has ", bin_size, " bytes (pointer at ", idx_path,
          " byte offset ", kHeaderBytes + 4 * num_seq + 8 * i, ")"));
    }
    total += len;
  }
  if (num_doc == 0 || document_indices_[0] != 0 ||
      document_indices_.back() != static_cast<int64_t>(num_seq)) {
    return absl::DataLossError(absl::StrCat(
        idx_path, ": document index must run from 0 to the sequence count ",
        num_seq, "; it has ", num_doc, " entries",
        num_doc > 0 ? absl::StrCat(" from ", document_indices_[0], " to ",
                                   document_indices_.back())
                    : ""));
  }
  for (uint64_t i = 1; i < num_doc; ++i) {
    if (document_indices_[i] < document_indices_[i - 1]) {
      return absl::DataLossError(absl::StrCat(
          idx_path, ": document index decreases at entry ", i, " (byte offset ",
          kHeaderBytes + 12 * num_seq + 8 * i, ")"));
    }
  }
  num_tokens_ = total;
  return absl::OkStatus();
}

void IndexedDataset::Read(int64_t seq, int64_t offset, int64_t length,
                          int64_t* out) const {
  CHECK(seq >= 0 && seq < num_sequences()) << prefix_ << ": sequence " << seq;
  CHECK(offset >= 0 && length >= 0 && offset + length <= lengths_[seq])
      << prefix_ << ": sequence " << seq << " of length " << lengths_[seq]
      << " read [" << offset << ", " << offset + length << ")";
  const size_t item = TokenDTypeSize(dtype_);
  const uint8_t* src = bin_data_ + pointers_[seq] + offset * item;
  switch (dtype_) {
    case TokenDType::kUInt8:
      for (int64_t i = 0; i < length; ++i) out[i] = src[i];
      break;
    case TokenDType::kInt8:
      for (int64_t i = 0; i < length; ++i) out[i] = static_cast<int8_t>(src[i]);
      break;
    case TokenDType::kUInt16:
      for (int64_t i = 0; i < length; ++i)
        out[i] = ReadLE<uint16_t>(src + 2 * i);
      break;
    case TokenDType::kInt16:
      for (int64_t i = 0; i < length; ++i)
        out[i] = ReadLE<int16_t>(src + 2 * i);
      break;
    case TokenDType::kInt32:
      for (int64_t i = 0; i < length; ++i)
        out[i] = ReadLE<int32_t>(src + 4 * i);
      break;
    case TokenDType::kInt64:
      if (length > 0) std::memcpy(out, src, length * 8);
      break;
    case TokenDType::kFloat32:
      for (int64_t i = 0; i < length; ++i) {
        out[i] = FloatToken(ReadLE<float>(src + 4 * i));
      }
      break;
    case TokenDType::kFloat64:
      for (int64_t i = 0; i < length; ++i) {
        out[i] = FloatToken(ReadLE<double>(src + 8 * i));
      }
      break;
  }
}

std::vector<int64_t> IndexedDataset::Get(int64_t seq) const {
  CHECK(seq >= 0 && seq < num_sequences()) << prefix_ << ": sequence " << seq;
  std::vector<int64_t> out(lengths_[seq]);
  Read(seq, 0, lengths_[seq], out.data());
  return out;
}

// ----------------------------------------------------- IndexedDatasetBuilder

namespace {

constexpr size_t kBuilderBufferBytes = 1 << 20;

// An error from the file system with what the builder was doing in front.
absl::Status Annotate(const absl::Status& status, absl::string_view what) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(what, ": ", status.message()));
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

absl::StatusOr<std::unique_ptr<IndexedDatasetBuilder>>
IndexedDatasetBuilder::Create(const std::string& prefix, TokenDType dtype) {
  std::unique_ptr<IndexedDatasetBuilder> b(new IndexedDatasetBuilder());
  b->prefix_ = prefix;
  b->dtype_ = dtype;
  const std::string tag = absl::StrCat(".tmp.", ::getpid(), ".",
                                       reinterpret_cast<uintptr_t>(b.get()));
  b->bin_tmp_ = BinPath(prefix) + tag;
  b->idx_tmp_ = IdxPath(prefix) + tag;
  auto bin = GetFileSystem()->NewWritableFile(b->bin_tmp_);
  if (!bin.ok()) return Annotate(bin.status(), prefix + ": dataset builder");
  b->bin_ = std::move(*bin);
  b->buffer_.reserve(kBuilderBufferBytes);
  return b;
}

IndexedDatasetBuilder::~IndexedDatasetBuilder() {
  bin_.reset();  // Closes without syncing.
  if (!finalized_) {
    // Best effort: the temporary names are never read as a dataset.
    GetFileSystem()->RemoveFile(bin_tmp_).IgnoreError();
    GetFileSystem()->RemoveFile(idx_tmp_).IgnoreError();
  }
}

absl::Status IndexedDatasetBuilder::FlushBuffer() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status s = bin_->Append(buffer_);
  buffer_.clear();
  if (!s.ok()) bin_.reset();  // The .bin is incomplete: no more appends.
  return s;
}

template <typename T>
absl::Status IndexedDatasetBuilder::AddSequenceImpl(
    absl::Span<const T> tokens) {
  if (finalized_ || bin_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix_, ": AddSequence after Finalize or after a failed write"));
  }
  if (tokens.size() >
      static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix_, ": sequence of ", tokens.size(), " tokens exceeds int32"));
  }
  const size_t item = TokenDTypeSize(dtype_);
  char tmp[4096];
  size_t fill = 0;
  // Tokens are encoded into tmp, then moved into buffer_, which goes to the
  // file when a sequence has been added whole and it holds 1 MiB or more.
  const size_t buffered_before = buffer_.size();
  auto flush = [&]() -> bool {
    buffer_.append(tmp, fill);
    fill = 0;
    return true;
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t t = static_cast<int64_t>(tokens[i]);
    bool fits = true;
    switch (dtype_) {
      case TokenDType::kUInt8: {
        fits = t >= 0 && t <= 255;
        uint8_t v = static_cast<uint8_t>(t);
        std::memcpy(tmp + fill, &v, 1);
        break;
      }
      case TokenDType::kInt8: {
        fits = t >= -128 && t <= 127;
        int8_t v = static_cast<int8_t>(t);
        std::memcpy(tmp + fill, &v, 1);
        break;
      }
      case TokenDType::kUInt16: {
        fits = t >= 0 && t <= 65535;
        uint16_t v = static_cast<uint16_t>(t);
        std::memcpy(tmp + fill, &v, 2);
        break;
      }
      case TokenDType::kInt16: {
        fits = t >= -32768 && t <= 32767;
        int16_t v = static_cast<int16_t>(t);
        std::memcpy(tmp + fill, &v, 2);
        break;
      }
      case TokenDType::kInt32: {
        fits = t >= std::numeric_limits<int32_t>::min() &&
               t <= std::numeric_limits<int32_t>::max();
        int32_t v = static_cast<int32_t>(t);
        std::memcpy(tmp + fill, &v, 4);
        break;
      }
      case TokenDType::kInt64:
        std::memcpy(tmp + fill, &t, 8);
        break;
      case TokenDType::kFloat32: {
        float v = static_cast<float>(t);
        std::memcpy(tmp + fill, &v, 4);
        break;
      }
      case TokenDType::kFloat64: {
        double v = static_cast<double>(t);
        std::memcpy(tmp + fill, &v, 8);
        break;
      }
    }
    if (!fits) {
      buffer_.resize(buffered_before);  // Nothing of this sequence stays.
      return absl::OutOfRangeError(absl::StrCat(
          prefix_, ": token ", t, " at position ", i, " of sequence ",
          lengths_.size(), " does not fit dtype ", TokenDTypeName(dtype_)));
    }
    fill += item;
    if (fill + 8 > sizeof(tmp)) flush();
  }
  flush();
  lengths_.push_back(static_cast<int32_t>(tokens.size()));
  bin_bytes_ += tokens.size() * item;
  if (buffer_.size() >= kBuilderBufferBytes) {
    return Annotate(FlushBuffer(), prefix_ + ": writing the .bin");
  }
  return absl::OkStatus();
}

absl::Status IndexedDatasetBuilder::AddSequence(absl::Span<const int64_t> t) {
  return AddSequenceImpl(t);
}
absl::Status IndexedDatasetBuilder::AddSequence(absl::Span<const int32_t> t) {
  return AddSequenceImpl(t);
}

void IndexedDatasetBuilder::EndDocument() {
  document_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

absl::Status IndexedDatasetBuilder::AddDocument(absl::Span<const int32_t> t) {
  absl::Status s = AddSequence(t);
  if (!s.ok()) return s;
  EndDocument();
  return absl::OkStatus();
}

absl::Status IndexedDatasetBuilder::Finalize() {
  if (finalized_) return absl::OkStatus();
  if (bin_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(prefix_, ": Finalize after a failed write"));
  }
  FileSystem* fs = GetFileSystem();
  const std::string what = prefix_ + ": finalizing the dataset";
  MCC_RETURN_IF_ERROR(Annotate(FlushBuffer(), what));
  absl::Status closed = bin_->SyncAndClose();
  bin_.reset();
  MCC_RETURN_IF_ERROR(Annotate(closed, what));

  const uint64_t version = kIndexVersion;
  const uint8_t code = static_cast<uint8_t>(dtype_);
  const uint64_t num_seq = lengths_.size();
  const uint64_t num_doc = document_indices_.size();
  std::vector<int64_t> pointers(num_seq);
  int64_t cur = 0;
  const int64_t item = TokenDTypeSize(dtype_);
  for (uint64_t i = 0; i < num_seq; ++i) {
    pointers[i] = cur;
    cur += lengths_[i] * item;
  }
  std::string idx(kIndexMagic, 9);
  auto put = [&idx](const void* data, size_t bytes) {
    idx.append(static_cast<const char*>(data), bytes);
  };
  put(&version, 8);
  put(&code, 1);
  put(&num_seq, 8);
  put(&num_doc, 8);
  put(lengths_.data(), 4 * num_seq);
  put(pointers.data(), 8 * num_seq);
  put(document_indices_.data(), 8 * num_doc);
  {
    auto file = fs->NewWritableFile(idx_tmp_);
    MCC_RETURN_IF_ERROR(Annotate(file.status(), what));
    MCC_RETURN_IF_ERROR(Annotate((*file)->Append(idx), what));
    MCC_RETURN_IF_ERROR(Annotate((*file)->SyncAndClose(), what));
  }
  // An older .idx goes first: from here until the new .idx is in place no
  // .idx describes the .bin under the final name, so no reader pairs the
  // new .bin with the old index.
  MCC_RETURN_IF_ERROR(Annotate(fs->RemoveFile(IdxPath(prefix_)), what));
  MCC_RETURN_IF_ERROR(Annotate(fs->Rename(bin_tmp_, BinPath(prefix_)), what));
  MCC_RETURN_IF_ERROR(Annotate(fs->Rename(idx_tmp_, IdxPath(prefix_)), what));
  finalized_ = true;
  return Annotate(fs->SyncDir(DirectoryOf(prefix_)), what);
}

}  // namespace mcc::data
