#include "observability/tensorboard_writer.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "observability/tensorboard_event.pb.h"

namespace mcc {
namespace observability {
namespace {

double NowSeconds() {
  return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(
    const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat(
        "--tensorboard-dir ", dir, ": cannot create it: ", ec.message()));
  }
  const double now = NowSeconds();
  const std::string path =
      absl::StrCat(dir, "/events.out.tfevents.", static_cast<int64_t>(now), ".",
                   HostName(), ".", getpid());
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter);
  absl::Status status = RecordWriter::Open(path, &writer->records_);
  if (!status.ok()) return status;
  tb::Event event;
  event.set_wall_time(now);
  event.set_file_version("brain.Event:2");
  status = writer->records_.Write(event.SerializeAsString());
  if (status.ok()) status = writer->records_.Flush();
  if (!status.ok()) return status;
  return writer;
}

absl::Status TensorBoardWriter::AddScalar(absl::string_view tag, double value,
                                          int64_t step) {
  return AddScalarAt(tag, value, step, NowSeconds());
}

absl::Status TensorBoardWriter::AddScalarAt(absl::string_view tag, double value,
                                            int64_t step, double wall_time) {
  tb::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tb::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(static_cast<float>(value));
  return records_.Write(event.SerializeAsString());
}

absl::Status TensorBoardWriter::Flush() { return records_.Flush(); }
absl::Status TensorBoardWriter::Close() { return records_.Close(); }

}  // namespace observability
}  // namespace mcc
