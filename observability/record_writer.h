#ifndef OBSERVABILITY_RECORD_WRITER_H_
#define OBSERVABILITY_RECORD_WRITER_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace observability {

// TFRecord framing, the container of TensorBoard event files. Each record is
//   uint64 length (little-endian)
//   uint32 masked CRC-32C of those 8 bytes
//   length bytes of data
//   uint32 masked CRC-32C of the data
// where mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t MaskedCrc32c(const void* data, size_t n);
// One framed record (appended to *out).
void AppendRecord(absl::string_view data, std::string* out);

// Appends records to a file. Not thread-safe; every error names the file.
// After an error the writer refuses further records (the file keeps what was
// written before).
class RecordWriter {
 public:
  // Creates (truncates) path.
  static absl::Status Open(const std::string& path, RecordWriter* writer);
  RecordWriter() = default;
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;
  ~RecordWriter();

  absl::Status Write(absl::string_view data);
  // Pushes buffered records to the operating system.
  absl::Status Flush();
  absl::Status Close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  absl::Status error_;
};

}  // namespace observability
}  // namespace mcc

#endif  // OBSERVABILITY_RECORD_WRITER_H_
