#ifndef DATA_INDEXED_DATASET_H_
#define DATA_INDEXED_DATASET_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/file_system.h"

namespace mcc::data {

// Token element types of Megatron's MMIDIDX index, by their on-disk codes
// (megatron/core/datasets/indexed_dataset.py, class DType).
enum class TokenDType : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

size_t TokenDTypeSize(TokenDType dtype);
const char* TokenDTypeName(TokenDType dtype);
absl::StatusOr<TokenDType> TokenDTypeFromCode(uint8_t code);
// Megatron's choice for a vocabulary: uint16 below 65500 tokens, else int32.
TokenDType OptimalTokenDType(int64_t vocab_size);

// "<prefix>.bin" and "<prefix>.idx".
std::string BinPath(const std::string& prefix);
std::string IdxPath(const std::string& prefix);

// The 9-byte magic at the start of every .idx file.
inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I',
                                        'D', 'X', 0,   0};
inline constexpr uint64_t kIndexVersion = 1;

// A read-only memory mapping of a whole file.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// A Megatron indexed dataset (.bin tokens + .idx index), read through a
// memory mapping of the .bin. The index arrays are copied into memory (they
// are unaligned in the file). Open() validates the whole index against the
// .bin, so reads need no further checks.
//
// Layout of the .idx (all little-endian):
//   "MMIDIDX\0\0"  u64 version (1)  u8 dtype code  u64 sequence count N
//   u64 document count D (entries of the document index, i.e. documents + 1)
//   i32 sequence_lengths[N]  i64 sequence_pointers[N] (byte offsets in .bin)
//   i64 document_indices[D] (0, then the end sequence of each document)
// An optional trailing i8 sequence_modes[N] (multimodal) is accepted and
// ignored.
class IndexedDataset {
 public:
  static absl::StatusOr<std::unique_ptr<IndexedDataset>> Open(
      const std::string& prefix);
  // The same checks on the two files' bytes in memory; prefix only names
  // them in errors. idx is copied; bin must outlive the dataset.
  static absl::StatusOr<std::unique_ptr<IndexedDataset>> FromMemory(
      const std::string& prefix, absl::string_view idx, absl::string_view bin);

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return lengths_.size(); }
  int64_t num_documents() const { return document_indices_.size() - 1; }
  int64_t num_tokens() const { return num_tokens_; }
  absl::Span<const int32_t> sequence_lengths() const { return lengths_; }
  absl::Span<const int64_t> sequence_pointers() const { return pointers_; }
  absl::Span<const int64_t> document_indices() const {
    return document_indices_;
  }

  // Copies tokens [offset, offset + length) of sequence `seq` into out as
  // int64. Arguments must lie inside the sequence (CHECKed). Float tokens
  // are truncated; one that no int64 holds (NaN, inf) reads as -1.
  void Read(int64_t seq, int64_t offset, int64_t length, int64_t* out) const;
  // The whole sequence.
  std::vector<int64_t> Get(int64_t seq) const;
  // Raw bytes of the .bin (for sequential-read baselines).
  const uint8_t* bin_data() const { return bin_data_; }
  size_t bin_size() const { return bin_size_; }

 private:
  IndexedDataset() = default;
  // Reads the header and arrays of the .idx (checks their sizes).
  absl::Status ParseIndex(absl::string_view idx);
  // Checks every sequence lies in the .bin and the document index is sound.
  absl::Status ValidateAgainstBin();
  std::string prefix_;
  TokenDType dtype_ = TokenDType::kUInt16;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> document_indices_;
  int64_t num_tokens_ = 0;
  std::unique_ptr<MappedFile> bin_;  // null for FromMemory
  const uint8_t* bin_data_ = nullptr;
  size_t bin_size_ = 0;
};

// Writes a .bin/.idx pair byte-compatible with Megatron-LM's
// IndexedDatasetBuilder, through the file system interface
// (core/file_system.h), so tests can inject write failures. Data goes to
// temporary files beside the final names; Finalize() syncs them, removes an
// older .idx at the prefix, then renames the .bin and last the .idx into
// place. So whatever step fails, the final names never hold a half-written
// file nor a .bin that the .idx beside it does not describe: the prefix
// holds the old pair untouched (failure before the old .idx is removed), no
// .idx (readers refuse it, naming the file), or the complete new pair.
// Errors name the file and the operation. Not thread-safe.
class IndexedDatasetBuilder {
 public:
  static absl::StatusOr<std::unique_ptr<IndexedDatasetBuilder>> Create(
      const std::string& prefix, TokenDType dtype);
  ~IndexedDatasetBuilder();  // Removes the temporary files if not finalized.

  // Appends one sequence; each token must fit the dtype.
  absl::Status AddSequence(absl::Span<const int64_t> tokens);
  absl::Status AddSequence(absl::Span<const int32_t> tokens);
  // Closes the current document (the sequences added since the last call).
  void EndDocument();
  // AddSequence + EndDocument.
  absl::Status AddDocument(absl::Span<const int32_t> tokens);
  // Writes the index and moves both files to their final names.
  absl::Status Finalize();

  int64_t num_sequences() const { return lengths_.size(); }
  int64_t bytes_written() const { return bin_bytes_; }

 private:
  IndexedDatasetBuilder() = default;
  template <typename T>
  absl::Status AddSequenceImpl(absl::Span<const T> tokens);

  // Appends buffer_ to the .bin (kept in memory up to 1 MiB between writes).
  absl::Status FlushBuffer();

  std::string prefix_, bin_tmp_, idx_tmp_;
  TokenDType dtype_ = TokenDType::kUInt16;
  std::unique_ptr<WritableFile> bin_;
  std::string buffer_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> document_indices_{0};
  int64_t bin_bytes_ = 0;
  bool finalized_ = false;
};

}  // namespace mcc::data

#endif  // DATA_INDEXED_DATASET_H_
