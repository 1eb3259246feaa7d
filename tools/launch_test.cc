// Runs tools/launch with launch_test_prog and checks rank prefixes, the
// environment, failure propagation and signal forwarding.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/comm/port_reservation.h"
#include "core/comm/socket.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

std::string g_launch, g_prog;

// A port held by "another job" for the length of a test.
struct PortReservationHolder {
  mcc::comm::PortReservation reservation =
      mcc::comm::PortReservation::Listen("127.0.0.1", 0).value();
  int port = reservation.port();
};

struct LaunchResult {
  int exit_code = -1;
  std::string output;
  absl::Duration elapsed;
};

// Runs the launcher; after `ready` appears in its output (when given) sends
// it `sig`.
LaunchResult Launch(std::vector<std::string> args,
                    const std::string& ready = "", int sig = 0,
                    int ready_count = 1) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const absl::Time start = absl::Now();
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(g_launch.c_str()));
    for (std::string& a : args) argv.push_back(&a[0]);
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  LaunchResult run;
  bool signalled = false;
  char buf[4096];
  while (true) {
    struct pollfd p = {fds[0], POLLIN, 0};
    poll(&p, 1, 100);
    if (p.revents) {
      ssize_t n = read(fds[0], buf, sizeof(buf));
      if (n <= 0) break;
      run.output.append(buf, n);
    }
    if (sig != 0 && !signalled) {
      int seen = 0;
      for (size_t at = 0;
           (at = run.output.find(ready, at)) != std::string::npos; ++at) {
        ++seen;
      }
      if (seen >= ready_count) {
        kill(pid, sig);
        signalled = true;
      }
    }
    if (absl::Now() - start > absl::Seconds(50)) kill(pid, SIGKILL);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  run.exit_code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  run.elapsed = absl::Now() - start;
  close(fds[0]);
  return run;
}

TEST(LaunchTest, StartsRanksWithTheirVariablesAndPrefixesOutput) {
  LaunchResult run = Launch({"--nproc_per_node=3", "--", g_prog, "ok"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(run.output,
                HasSubstr(absl::StrCat("[rank ", r, "] rank=", r,
                                       " world=3 local_rank=", r,
                                       " local_world=3 master=127.0.0.1:")));
    EXPECT_THAT(run.output,
                HasSubstr(absl::StrCat("[rank ", r, "] to stderr")));
  }
  EXPECT_FALSE(absl::StrContains(run.output, ":0\n")) << "port 0 passed on";
}

TEST(LaunchTest, MultiNodeRanksAndDashedFlags) {
  LaunchResult run =
      Launch({"--nproc-per-node", "2", "--nnodes=3", "--node-rank=1",
              "--master-port=1234", "--", g_prog, "ok"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output,
              HasSubstr("[rank 2] rank=2 world=6 local_rank=0 local_world=2 "
                        "master=127.0.0.1:1234"));
  EXPECT_THAT(run.output, HasSubstr("[rank 3] rank=3 world=6 local_rank=1"));
}

TEST(LaunchTest, RanksRendezvousAndAllReduce) {
  LaunchResult run = Launch({"--nproc_per_node=4", "--", g_prog, "allreduce"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(run.output, HasSubstr(absl::StrCat("[rank ", r, "] sum=10")));
  }
}

// The text after `key` up to the end of its line, in the given rank's output.
std::string RankValue(const std::string& output, int rank,
                      const std::string& key) {
  const std::string tag = absl::StrCat("[rank ", rank, "] ", key);
  const size_t at = output.find(tag);
  if (at == std::string::npos) return "";
  const size_t from = at + tag.size();
  return output.substr(from, output.find_first_of(" \n", from) - from);
}

TEST(LaunchTest, EachJobHasItsOwnIdAndRankZeroGetsTheHeldPort) {
  LaunchResult a = Launch({"--nproc_per_node=2", "--", g_prog, "allreduce"});
  LaunchResult b = Launch({"--nproc_per_node=2", "--", g_prog, "allreduce"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const std::string job = RankValue(a.output, 0, "job=");
  EXPECT_EQ(job.size(), 16u) << a.output;
  EXPECT_EQ(RankValue(a.output, 1, "job="), job);
  EXPECT_NE(RankValue(b.output, 0, "job="), job);
  EXPECT_EQ(RankValue(a.output, 0, "handed_socket="), "yes");
  EXPECT_EQ(RankValue(a.output, 1, "handed_socket="), "no");
  // --rdzv_id names the job on every node.
  LaunchResult named =
      Launch({"--nproc_per_node=1", "--rdzv-id=run7", "--", g_prog, "ok"});
  EXPECT_EQ(RankValue(named.output, 0, "job="), "run7") << named.output;
}

TEST(LaunchTest, APortAnotherJobHoldsIsAClearErrorBeforeAnyRankStarts) {
  PortReservationHolder held;
  LaunchResult run =
      Launch({"--nproc_per_node=2", absl::StrCat("--master_port=", held.port),
              "--", g_prog, "ok"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("cannot hold the rendezvous port"));
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat(held.port)));
  EXPECT_FALSE(absl::StrContains(run.output, "[rank 0]")) << run.output;
}

// Node 1 of another job given this job's port: its ranks are refused by
// rank 0's store, naming both jobs, and this job still completes with its
// own node 1.
TEST(LaunchTest, RanksOfAnotherJobAreRefusedAndTheJobCompletes) {
  const std::string port =
      absl::StrCat("--master_port=", mcc::comm::FindFreePort().value());
  const std::vector<std::string> node = {"--nproc_per_node=2", "--nnodes=2",
                                         port};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = node;
    args.insert(args.end(), extra.begin(), extra.end());
    for (const char* a : {"--", g_prog.c_str(), "allreduce"}) {
      args.push_back(a);
    }
    return args;
  };
  LaunchResult node0;
  std::thread first([&] {
    node0 = Launch(with({"--node_rank=0", "--rdzv_id=first"}));
  });
  LaunchResult intruder = Launch(with({"--node_rank=1", "--rdzv_id=second"}));
  EXPECT_NE(intruder.exit_code, 0) << intruder.output;
  EXPECT_THAT(intruder.output, HasSubstr("of job 'second'"));
  EXPECT_THAT(intruder.output,
              HasSubstr("reached the rendezvous store of job 'first'"));
  LaunchResult node1 = Launch(with({"--node_rank=1", "--rdzv_id=first"}));
  first.join();
  EXPECT_EQ(node1.exit_code, 0) << node1.output;
  EXPECT_EQ(node0.exit_code, 0) << node0.output;
  EXPECT_THAT(node0.output, HasSubstr("[rank 0] sum=10"));
  EXPECT_THAT(node1.output, HasSubstr("[rank 3] sum=10"));
}

// One node: each job gets a fresh secret of its own in the environment,
// which its ranks prove to rank 0's store.
TEST(LaunchTest, OneNodeJobsGetASecret) {
  LaunchResult run = Launch({"--nproc_per_node=2", "--", g_prog, "allreduce"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(RankValue(run.output, 0, "secret="), "env:64") << run.output;
  EXPECT_EQ(RankValue(run.output, 1, "secret="), "env:64") << run.output;
  EXPECT_THAT(run.output, HasSubstr("[rank 1] sum=3"));
  EXPECT_FALSE(absl::StrContains(run.output, "unauthenticated")) << run.output;
}

std::string WriteSecret(const std::string& name, const std::string& text,
                        mode_t mode) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir ? dir : "/tmp", "/", name);
  FILE* f = fopen(path.c_str(), "w");
  fputs(text.c_str(), f);
  fclose(f);
  chmod(path.c_str(), mode);
  return path;
}

// Across nodes every launcher reads the same secret file; a node with
// another secret (of the same job id, on the same port) cannot join, and the
// job completes with the right node.
TEST(LaunchTest, NodesShareASecretFileAndOthersAreRefused) {
  const std::string right = WriteSecret("right.secret", "s3cret-a\n", 0600);
  const std::string wrong = WriteSecret("wrong.secret", "s3cret-b\n", 0644);
  const std::string port =
      absl::StrCat("--master_port=", mcc::comm::FindFreePort().value());
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--nproc_per_node=2", "--nnodes=2", port,
                                     "--rdzv_id=shared"};
    args.insert(args.end(), extra.begin(), extra.end());
    for (const char* a : {"--", g_prog.c_str(), "allreduce"}) {
      args.push_back(a);
    }
    return args;
  };
  LaunchResult node0;
  std::thread first([&] {
    node0 = Launch(with({"--node_rank=0", "--rdzv-secret-file=" + right}));
  });
  LaunchResult stranger =
      Launch(with({"--node_rank=1", "--rdzv-secret-file=" + wrong}));
  EXPECT_NE(stranger.exit_code, 0) << stranger.output;
  EXPECT_THAT(stranger.output, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(stranger.output,
              HasSubstr("the proof of the job secret is wrong"));
  LaunchResult node1 =
      Launch(with({"--node_rank=1", "--rdzv-secret-file=" + right}));
  first.join();
  EXPECT_EQ(node1.exit_code, 0) << node1.output;
  EXPECT_EQ(node0.exit_code, 0) << node0.output;
  EXPECT_EQ(RankValue(node1.output, 2, "secret="), "file") << node1.output;
  // A file others can read is pointed out.
  EXPECT_THAT(stranger.output, HasSubstr("can be read by other users"));
  EXPECT_FALSE(absl::StrContains(node1.output, "can be read by other users"))
      << node1.output;
  EXPECT_THAT(node0.output, HasSubstr("[rank 0] sum=10"));
  EXPECT_THAT(node1.output, HasSubstr("[rank 3] sum=10"));
}

TEST(LaunchTest, AMissingSecretFileIsAnErrorBeforeAnyRankStarts) {
  LaunchResult run =
      Launch({"--nproc_per_node=2", "--rdzv-secret-file=/nonexistent/secret",
              "--", g_prog, "ok"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("/nonexistent/secret"));
  EXPECT_FALSE(absl::StrContains(run.output, "[rank 0]")) << run.output;
}

TEST(LaunchTest, FailingRankStopsTheOthersAndSetsTheExitCode) {
  LaunchResult run =
      Launch({"--nproc_per_node=3", "--", g_prog, "fail", "1", "13"});
  EXPECT_EQ(run.exit_code, 13) << run.output;
  EXPECT_THAT(run.output, HasSubstr("[rank 1] failing now"));
  EXPECT_THAT(run.output, HasSubstr("rank 1 (pid"));
  EXPECT_THAT(run.output, HasSubstr("exited with code 13"));
  EXPECT_LT(run.elapsed, absl::Seconds(10)) << run.output;
}

TEST(LaunchTest, RanksIgnoringSigtermAreKilledAfterTheGracePeriod) {
  LaunchResult run = Launch({"--nproc_per_node=2", "--grace_period_s=1", "--",
                             g_prog, "stubborn", "0", "7"});
  EXPECT_EQ(run.exit_code, 7) << run.output;
  EXPECT_THAT(run.output, HasSubstr("sending SIGKILL"));
  EXPECT_LT(run.elapsed, absl::Seconds(10)) << run.output;
}

// A stopped rank (a hung node) keeps SIGTERM pending: the launcher names it
// before the SIGKILL, as no flight-recorder dump can when it stopped before
// the first collective.
TEST(LaunchTest, AStoppedRankIsNamedWhenTheJobIsKilled) {
  LaunchResult run = Launch({"--nproc_per_node=2", "--grace_period_s=1", "--",
                             g_prog, "stopped", "1", "5"});
  EXPECT_EQ(run.exit_code, 5) << run.output;
  EXPECT_THAT(run.output, HasSubstr("rank 0 (pid"));
  EXPECT_THAT(run.output,
              ::testing::ContainsRegex("rank 1 \\(pid [0-9]+\\) is stopped"));
  EXPECT_THAT(run.output, HasSubstr("sending SIGKILL"));
  EXPECT_LT(run.elapsed, absl::Seconds(10)) << run.output;
}

TEST(LaunchTest, ForwardsSigint) {
  LaunchResult run = Launch({"--nproc_per_node=2", "--", g_prog, "wait_signal"},
                            "] ready", SIGINT, 2);
  EXPECT_THAT(run.output, HasSubstr("[rank 0] got signal 2"));
  EXPECT_THAT(run.output, HasSubstr("[rank 1] got signal 2"));
  EXPECT_EQ(run.exit_code, 130) << run.output;
}

TEST(LaunchTest, ForwardsSigterm) {
  LaunchResult run = Launch({"--nproc_per_node=2", "--", g_prog, "wait_signal"},
                            "] ready", SIGTERM, 2);
  EXPECT_THAT(run.output, HasSubstr("[rank 1] got signal 15"));
  EXPECT_EQ(run.exit_code, 143) << run.output;
}

// Ranks that handle the signal and exit 0 (train --exit-signal-handler)
// end the job with 0: it stopped as asked, nothing failed.
TEST(LaunchTest, RanksThatStopCleanlyOnSigtermEndTheJobWithZero) {
  LaunchResult run =
      Launch({"--nproc_per_node=2", "--", g_prog, "handle_signal"}, "] ready",
             SIGTERM, 2);
  EXPECT_THAT(run.output,
              HasSubstr("[rank 1] stopping cleanly after signal 15"));
  EXPECT_THAT(run.output, HasSubstr("every rank exited 0 after signal 15"));
  EXPECT_EQ(run.exit_code, 0) << run.output;
}

// A rank still running long after another exited 0 (stopped, or hung in
// its teardown) is stopped and named, and the job fails instead of waiting.
TEST(LaunchTest, ARankLingeringAfterTheOthersExitedIsStopped) {
  LaunchResult run =
      Launch({"--nproc_per_node=3", "--rank_exit_timeout_s=0.5",
              "--grace_period_s=0.5", "--", g_prog, "linger", "2"});
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("rank 2 (pid "));
  EXPECT_THAT(run.output, HasSubstr("after another rank exited 0"));
  EXPECT_LT(run.elapsed, absl::Seconds(20)) << run.output;
}

TEST(LaunchTest, MissingProgramIsAnError) {
  LaunchResult run = Launch({"--nproc_per_node=2"});
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.output, HasSubstr("no program given"));
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    fprintf(stderr, "usage: launch_test LAUNCH PROGRAM\n");
    return 2;
  }
  g_launch = argv[1];
  g_prog = argv[2];
  return RUN_ALL_TESTS();
}
