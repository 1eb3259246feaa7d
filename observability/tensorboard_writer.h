#ifndef OBSERVABILITY_TENSORBOARD_WRITER_H_
#define OBSERVABILITY_TENSORBOARD_WRITER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "observability/record_writer.h"

namespace mcc {
namespace observability {

// Writes scalars to a TensorBoard event file, as TensorBoard's own
// SummaryWriter does: a file `events.out.tfevents.<seconds>.<host>.<pid>`
// in `dir`, starting with the file-version event, then one Event with a
// Summary per scalar.
//
// Ownership: the writer owns its file and closes it when destroyed.
// Thread-safety: none; one thread (rank 0's training loop) writes.
// Errors: every failure names the file; after a write error the writer
// returns that error for every later call and keeps what was written.
class TensorBoardWriter {
 public:
  // Creates dir (and its parents) if needed and a new event file in it.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(
      const std::string& dir);

  // Appends one scalar at `step`, stamped with the current wall time.
  absl::Status AddScalar(absl::string_view tag, double value, int64_t step);
  // The same with a given wall time (seconds since the epoch), for tests.
  absl::Status AddScalarAt(absl::string_view tag, double value, int64_t step,
                           double wall_time);
  // Makes what was written visible to TensorBoard.
  absl::Status Flush();
  absl::Status Close();

  const std::string& path() const { return records_.path(); }

 private:
  TensorBoardWriter() = default;
  RecordWriter records_;
};

}  // namespace observability
}  // namespace mcc

#endif  // OBSERVABILITY_TENSORBOARD_WRITER_H_
