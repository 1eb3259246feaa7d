#include "observability/record_writer.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/crc32c.h"

namespace mcc {
namespace observability {

uint32_t MaskedCrc32c(const void* data, size_t n) {
  const uint32_t crc = Crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

namespace {

void AppendLittleEndian(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i)
    out->push_back(static_cast<char>(v >> (8 * i)));
}

}  // namespace

void AppendRecord(absl::string_view data, std::string* out) {
  std::string length;
  AppendLittleEndian(data.size(), 8, &length);
  out->append(length);
  AppendLittleEndian(MaskedCrc32c(length.data(), length.size()), 4, out);
  out->append(data.data(), data.size());
  AppendLittleEndian(MaskedCrc32c(data.data(), data.size()), 4, out);
}

absl::Status RecordWriter::Open(const std::string& path, RecordWriter* writer) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot create event file ", path, ": ", std::strerror(errno)));
  }
  if (writer->file_ != nullptr) std::fclose(writer->file_);
  writer->file_ = f;
  writer->path_ = path;
  writer->error_ = absl::OkStatus();
  return absl::OkStatus();
}

RecordWriter::~RecordWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status RecordWriter::Write(absl::string_view data) {
  if (!error_.ok()) return error_;
  if (file_ == nullptr) {
    return absl::FailedPreconditionError("event record writer is not open");
  }
  std::string record;
  AppendRecord(data, &record);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    error_ = absl::DataLossError(
        absl::StrCat("writing ", record.size(), " bytes to ", path_,
                     " failed: ", std::strerror(errno)));
  }
  return error_;
}

absl::Status RecordWriter::Flush() {
  if (!error_.ok() || file_ == nullptr) return error_;
  if (std::fflush(file_) != 0) {
    error_ = absl::DataLossError(
        absl::StrCat("flushing ", path_, " failed: ", std::strerror(errno)));
  }
  return error_;
}

absl::Status RecordWriter::Close() {
  if (file_ == nullptr) return error_;
  absl::Status status = Flush();
  if (std::fclose(file_) != 0 && status.ok()) {
    status = absl::DataLossError(
        absl::StrCat("closing ", path_, " failed: ", std::strerror(errno)));
  }
  file_ = nullptr;
  return status;
}

}  // namespace observability
}  // namespace mcc
