#include "core/comm/flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace comm {
namespace {

// The self-pipe between signal handlers and the watcher thread: the handler
// writes the signal number, the watcher dumps and, for fatal signals, sets
// g_dumped so the handler can re-raise.
int g_pipe[2] = {-1, -1};
std::atomic<int> g_dumped{0};

void OnSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (g_pipe[1] >= 0) {
    ssize_t ignored = write(g_pipe[1], &byte, 1);
    (void)ignored;
  }
  if (sig == SIGUSR1) return;
  // Fatal: give the watcher up to two seconds, then die as we would have.
  for (int i = 0; i < 200 && g_dumped.load() == 0; ++i) usleep(10000);
  signal(sig, SIG_DFL);
  raise(sig);
}

}  // namespace

FlightRecorder& FlightRecorder::Global() {
  static FlightRecorder* recorder = new FlightRecorder;
  return *recorder;
}

FlightRecorder::FlightRecorder() : capacity_(2048) {
  int64_t n = 0;
  if (const char* v = std::getenv("MCC_FLIGHT_RECORDER_ENTRIES");
      v != nullptr && absl::SimpleAtoi(v, &n) && n > 0) {
    capacity_ = static_cast<int>(n);
  }
  if (const char* dir = std::getenv("MCC_FLIGHT_RECORDER_DIR");
      dir != nullptr && *dir != '\0') {
    int64_t rank = 0;
    const char* r = std::getenv("RANK");
    if (r == nullptr || !absl::SimpleAtoi(r, &rank)) rank = 0;
    dir_ = dir;
    rank_ = static_cast<int>(rank);
    InstallSignalHandlers();
  }
}

int64_t FlightRecorder::NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void FlightRecorder::set_capacity(int capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = capacity > 0 ? capacity : 1;
  while (static_cast<int>(ring_.size()) > capacity_) ring_.pop_front();
}

void FlightRecorder::SetDumpDirectory(std::string dir, int global_rank) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir_ = std::move(dir);
    rank_ = global_rank;
  }
  InstallSignalHandlers();
}

std::string FlightRecorder::dump_directory() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dir_;
}

void FlightRecorder::InstallSignalHandlers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (handlers_installed_ || dir_.empty()) return;
    handlers_installed_ = true;
  }
  if (pipe(g_pipe) != 0) {
    LOG(WARNING) << "flight recorder: no pipe for signal dumps: "
                 << std::strerror(errno);
    return;
  }
  fcntl(g_pipe[1], F_SETFL, O_NONBLOCK);
  std::thread([this] {
    unsigned char sig = 0;
    while (read(g_pipe[0], &sig, 1) == 1) {
      Dump(absl::StrCat("signal ", static_cast<int>(sig), " (", strsignal(sig),
                        ")"))
          .IgnoreError();
      if (sig != SIGUSR1) g_dumped.store(1);
    }
  }).detach();
  for (int sig : {SIGUSR1, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = &OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(sig, &sa, nullptr);
  }
}

int64_t FlightRecorder::Start(FlightRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  record.id = next_id_++;
  record.state = "started";
  record.start_us = NowMicros();
  ring_.push_back(std::move(record));
  while (static_cast<int>(ring_.size()) > capacity_) ring_.pop_front();
  return ring_.back().id;
}

void FlightRecorder::Finish(int64_t id, const absl::Status& status) {
  const int64_t now = NowMicros();
  std::lock_guard<std::mutex> lock(mu_);
  if (ring_.empty() || id < ring_.front().id || id > ring_.back().id) return;
  FlightRecord& r = ring_[static_cast<size_t>(id - ring_.front().id)];
  r.end_us = now;
  r.state = status.ok() ? "completed" : "failed";
  if (!status.ok()) r.error = std::string(status.message());
}

std::vector<FlightRecord> FlightRecorder::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<FlightRecord>(ring_.begin(), ring_.end());
}

std::string FlightRecorder::ToJson(absl::string_view reason) const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json entries = nlohmann::json::array();
  for (const FlightRecord& r : ring_) {
    entries.push_back({{"id", r.id},
                       {"group", r.group},
                       {"group_ranks", r.group_ranks},
                       {"op", r.op},
                       {"signature", r.signature},
                       {"seq", r.seq},
                       {"p2p_index", r.p2p_index},
                       {"peer", r.peer},
                       {"bytes", r.bytes},
                       {"start_us", r.start_us},
                       {"end_us", r.end_us},
                       {"state", r.state},
                       {"error", r.error}});
  }
  nlohmann::json doc = {{"rank", rank_},
                        {"pid", static_cast<int64_t>(getpid())},
                        {"reason", std::string(reason)},
                        {"dumped_at_us", NowMicros()},
                        {"entries", entries}};
  return doc.dump(1);
}

absl::Status FlightRecorder::Dump(absl::string_view reason) {
  std::string dir;
  int rank;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dir = dir_;
    rank = rank_;
  }
  if (dir.empty()) return absl::OkStatus();
  const std::string path =
      absl::StrCat(dir, "/flight_recorder_rank", rank, ".json");
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << ToJson(reason);
    out.close();
    if (!out) {
      const absl::Status s = absl::UnavailableError(
          absl::StrCat("flight recorder: writing ", tmp, " failed"));
      LOG(WARNING) << s.message();
      return s;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const absl::Status s = absl::UnavailableError(absl::StrCat(
        "flight recorder: renaming ", tmp, " to ", path, " failed"));
    LOG(WARNING) << s.message();
    return s;
  }
  LOG(WARNING) << "flight recorder: dumped the last collectives of rank "
               << rank << " to " << path << " (" << reason << ")";
  return absl::OkStatus();
}

}  // namespace comm
}  // namespace mcc
