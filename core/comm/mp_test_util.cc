#include "core/comm/mp_test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/comm/env.h"
#include "core/comm/port_reservation.h"
#include "core/comm/store_auth.h"
#include "glog/logging.h"
#include "gtest/gtest.h"

namespace mcc {
namespace comm {
namespace testing {
namespace {

std::map<std::string, std::function<int()>>& Registry() {
  static auto* registry = new std::map<std::string, std::function<int()>>;
  return *registry;
}

std::string TempDir() {
  const char* d = std::getenv("TEST_TMPDIR");
  return d != nullptr ? d : "/tmp";
}

}  // namespace

bool RegisterWorker(const std::string& name, std::function<int()> fn) {
  Registry()[name] = std::move(fn);
  return true;
}

int MaybeRunWorker(int argc, char** argv) {
  const char* name = std::getenv("MCC_TEST_WORKER");
  if (name == nullptr) return -1;
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  auto it = Registry().find(name);
  if (it == Registry().end()) {
    fprintf(stderr, "no worker named %s\n", name);
    return 99;
  }
  int code = it->second();
  fflush(stdout);
  fflush(stderr);
  return code;
}

std::vector<WorkerResult> RunWorkers(
    int world_size, const std::string& name, absl::Duration timeout,
    const std::function<std::map<std::string, std::string>(int)>& extra_env) {
  // Held until rank 0 serves on it, as tools/launch does: tests run side by
  // side, and a port merely found free could be picked by two of them.
  PortReservation reservation = PortReservation::Listen("127.0.0.1", 0).value();
  const int port = reservation.port();
  const std::string job_id = RandomJobId();
  // Every test job's store is authenticated, as tools/launch's are.
  const std::string secret = RandomSecretHex().value();
  static int run_counter = 0;
  const std::string dir =
      absl::StrCat(TempDir(), "/mp_", getpid(), "_", run_counter++);
  mkdir(dir.c_str(), 0755);
  std::vector<pid_t> pids(world_size);
  std::vector<WorkerResult> results(world_size);
  const absl::Time start = absl::Now();
  for (int r = 0; r < world_size; ++r) {
    std::map<std::string, std::string> env = {
        {"MCC_TEST_WORKER", name},
        {"RANK", std::to_string(r)},
        {"WORLD_SIZE", std::to_string(world_size)},
        {"LOCAL_RANK", std::to_string(r)},
        {"LOCAL_WORLD_SIZE", std::to_string(world_size)},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", std::to_string(port)},
        {kJobIdEnv, job_id},
        {kJobSecretEnv, secret},
    };
    if (extra_env) {
      for (auto& kv : extra_env(r)) env[kv.first] = kv.second;
    }
    const std::string out_path = absl::StrCat(dir, "/rank", r, ".log");
    pid_t pid = fork();
    CHECK_GE(pid, 0);
    if (pid == 0) {
      for (auto& kv : env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
      unsetenv(kStoreListenFdEnv);
      if (r == 0) reservation.HandToChild();
      int fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
      char* argv[] = {const_cast<char*>("/proc/self/exe"), nullptr};
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    pids[r] = pid;
    results[r].rank = r;
  }
  reservation.Release();
  int remaining = world_size;
  bool killed = false;
  while (remaining > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < world_size; ++r) {
        if (pids[r] != pid) continue;
        results[r].exit_code =
            WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        results[r].elapsed = absl::Now() - start;
        results[r].timed_out = killed;
        pids[r] = -1;
        --remaining;
      }
      continue;
    }
    if (!killed && absl::Now() - start > timeout) {
      for (int r = 0; r < world_size; ++r) {
        if (pids[r] > 0) kill(pids[r], SIGKILL);
      }
      killed = true;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (int r = 0; r < world_size; ++r) {
    std::ifstream in(absl::StrCat(dir, "/rank", r, ".log"));
    std::stringstream ss;
    ss << in.rdbuf();
    results[r].output = ss.str();
  }
  return results;
}

int ReportFailure(const std::string& what, const absl::Status& status,
                  int exit_code) {
  fprintf(stderr, "%s failed: %s\n", what.c_str(), status.ToString().c_str());
  return exit_code;
}

std::string Describe(const std::vector<WorkerResult>& results) {
  std::string out;
  for (const WorkerResult& r : results) {
    absl::StrAppend(&out, "---- rank ", r.rank, " exit ", r.exit_code,
                    r.timed_out ? " (killed after the timeout)" : "", " after ",
                    absl::FormatDuration(r.elapsed), ":\n", r.output, "\n");
  }
  return out;
}

}  // namespace testing
}  // namespace comm
}  // namespace mcc
