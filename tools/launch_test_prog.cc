// A rank program for launch_test: prints its environment, then behaves as
// MODE (argv[1]) says:
//   ok            exit 0
//   fail R C      rank R exits with code C after 0.3 s; the others wait
//                 (up to 60 s) to be stopped
//   stubborn R C  as fail, but the others ignore SIGTERM
//   wait_signal   print "ready", exit 130 on SIGINT or 143 on SIGTERM
//   linger R      rank R sleeps (up to 60 s, as a rank stopped after the
//                 job's last collective); the others exit 0
//   handle_signal print "ready", exit 0 on SIGTERM (as a program that saves
//                 and stops cleanly)
//   allreduce     all-reduce (rank + 1) over the world through core/comm
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/comm/init.h"
#include "core/tensor.h"

namespace {
volatile sig_atomic_t got = 0;
void OnSignal(int sig) { got = sig; }
}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  const int rank = std::atoi(std::getenv("RANK"));
  const char* job = std::getenv("MCC_JOB_ID");
  printf("rank=%s world=%s local_rank=%s local_world=%s master=%s:%s\n",
         std::getenv("RANK"), std::getenv("WORLD_SIZE"),
         std::getenv("LOCAL_RANK"), std::getenv("LOCAL_WORLD_SIZE"),
         std::getenv("MASTER_ADDR"), std::getenv("MASTER_PORT"));
  printf("job=%s\nhanded_socket=%s\n", job ? job : "(none)",
         std::getenv("MCC_STORE_LISTEN_FD") ? "yes" : "no");
  // Where the secret comes from, never the secret.
  const char* secret = std::getenv("MCC_JOB_SECRET");
  const char* secret_file = std::getenv("MCC_JOB_SECRET_FILE");
  if (secret != nullptr) {
    printf("secret=env:%zu\n", strlen(secret));
  } else {
    printf("secret=%s\n", secret_file != nullptr ? "file" : "none");
  }
  fprintf(stderr, "to stderr\n");
  fflush(stdout);
  if (mode == "linger") {
    if (rank == std::atoi(argv[2])) sleep(60);
    return 0;
  }
  if (mode == "stopped") {  // Rank argv[2] stops itself; the others fail.
    if (rank == std::atoi(argv[2])) {
      raise(SIGSTOP);
      return 0;
    }
    usleep(300000);
    return std::atoi(argv[3]);
  }
  if (mode == "fail" || mode == "stubborn") {
    const int bad = std::atoi(argv[2]);
    if (rank == bad) {
      usleep(300000);
      printf("failing now\n");
      return std::atoi(argv[3]);
    }
    if (mode == "stubborn") signal(SIGTERM, SIG_IGN);
    sleep(60);
    return 0;
  }
  if (mode == "wait_signal") {
    signal(SIGINT, OnSignal);
    signal(SIGTERM, OnSignal);
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 600 && got == 0; ++i) usleep(100000);
    printf("got signal %d\n", static_cast<int>(got));
    return got == SIGINT ? 130 : got == SIGTERM ? 143 : 1;
  }
  if (mode == "handle_signal") {
    signal(SIGTERM, OnSignal);
    printf("ready\n");
    fflush(stdout);
    for (int i = 0; i < 600 && got == 0; ++i) usleep(100000);
    printf("stopping cleanly after signal %d\n", static_cast<int>(got));
    return got == SIGTERM ? 0 : 1;
  }
  if (mode == "allreduce") {
    mcc::comm::GroupOptions options;
    // Generous: launch_test's shared-secret case starts the second node
    // only after a stranger's launch has been refused, and on a loaded
    // machine that took node 0's ranks past a 20 s wait (2026-12-05 CI).
    options.timeout = absl::Seconds(60);
    auto world = mcc::comm::InitWorldFromEnvironment(options);
    if (!world.ok()) {
      fprintf(stderr, "%s\n", world.status().ToString().c_str());
      return 3;
    }
    mcc::Tensor t = mcc::Tensor::Full({3}, rank + 1, mcc::DType::kInt64);
    absl::Status s = world->group->AllReduceSync(&t, mcc::comm::ReduceOp::kSum);
    if (!s.ok()) {
      fprintf(stderr, "%s\n", s.ToString().c_str());
      return 3;
    }
    printf("sum=%lld\n", static_cast<long long>(t.ToDoubles()[0]));
    return 0;
  }
  return 0;
}
