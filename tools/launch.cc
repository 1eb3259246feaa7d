// tools/launch: starts N local processes of a distributed job with
// torchrun's environment variables, prefixes their output with their rank,
// forwards SIGINT and SIGTERM, and when one rank fails stops the others and
// exits with the failing rank's code, or, with --max-restarts K, starts the
// job again up to K times (it resumes from its latest checkpoint).
//
// On node 0 the launcher listens on the rendezvous port itself and hands the
// socket to rank 0, so no other job can take the port in between; each job
// carries an id (MCC_JOB_ID) that rank 0's store checks, so ranks that reach
// another job's store fail at once, naming both jobs. Each job also carries
// a secret that every connection to the store must prove (a
// challenge-response, never the secret itself): a random one on one node
// (MCC_JOB_SECRET), a file every node reads across nodes
// (--rdzv-secret-file, passed on as MCC_JOB_SECRET_FILE).
//
//   tools/launch --nproc_per_node N [--nnodes M --node_rank R
//       --master_addr A --master_port P --rdzv_id ID
//       --rdzv-secret-file FILE] [--max-restarts K] -- PROGRAM ARGS...
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/comm/env.h"
#include "core/comm/port_reservation.h"
#include "core/comm/socket.h"
#include "core/comm/store_auth.h"

ABSL_FLAG(int, nproc_per_node, 1, "Processes to start on this node.");
ABSL_FLAG(int, nnodes, 1, "Number of nodes.");
ABSL_FLAG(int, node_rank, 0, "This node's index, 0..nnodes-1.");
ABSL_FLAG(std::string, master_addr, "127.0.0.1",
          "Host of rank 0, which serves the rendezvous store.");
ABSL_FLAG(int, master_port, 0,
          "Port of the rendezvous store; 0 picks a free one (one node only).");
ABSL_FLAG(std::string, rdzv_id, "",
          "The job's id (torchrun's flag), the same on every node: rank 0's "
          "store refuses ranks of another job. One node: a random id when "
          "empty; several nodes: no check when empty.");
ABSL_FLAG(std::string, rdzv_secret_file, "",
          "A file holding the job's secret, the same file content on every "
          "node: rank 0's store serves only connections that prove it. "
          "Without it: MCC_JOB_SECRET or MCC_JOB_SECRET_FILE from the "
          "environment, else a random secret on one node; several nodes "
          "without any secret run an unauthenticated store (with a warning).");
ABSL_FLAG(int, max_restarts, 0,
          "When a rank fails, stop the job and start it again, up to this "
          "many times (torchrun's flag); the program resumes from its own "
          "checkpoint (train: --load equal to --save). Ranks see the attempt "
          "in TORCHELASTIC_RESTART_COUNT.");
ABSL_FLAG(double, rank_exit_timeout_s, 60,
          "Seconds the other ranks may keep running once one rank has exited "
          "0 (the job's collectives are over); a rank still running then "
          "(stopped by SIGSTOP, or hung in its teardown) is stopped as a "
          "failed rank, so the job ends instead of waiting for it.");
ABSL_FLAG(double, grace_period_s, 10,
          "Seconds between SIGTERM and SIGKILL when stopping ranks (at most "
          "25).");

namespace {

int signal_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  const char c = static_cast<char>(sig);
  (void)!write(signal_pipe[1], &c, 1);
}

struct Child {
  int rank = 0;
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  std::string out_buf, err_buf;
  bool running = false;
  int exit_code = 0;
};

void WriteAll(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = write(fd, s.data() + off, s.size() - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;
    }
    off += static_cast<size_t>(w);
  }
}

// Writes the complete lines of buf (all of it when flush), each prefixed.
void EmitLines(int rank, std::string* buf, int fd, bool flush) {
  std::string out;
  size_t start = 0;
  while (true) {
    size_t nl = buf->find('\n', start);
    if (nl == std::string::npos) break;
    absl::StrAppend(&out, "[rank ", rank, "] ",
                    absl::string_view(*buf).substr(start, nl - start + 1));
    start = nl + 1;
  }
  buf->erase(0, start);
  if (flush && !buf->empty()) {
    absl::StrAppend(&out, "[rank ", rank, "] ", *buf, "\n");
    buf->clear();
  }
  WriteAll(fd, out);
}

void Log(const std::string& s) { WriteAll(2, "[launch] " + s + "\n"); }

// Whether process pid is stopped (state T or t in /proc/PID/stat: after the
// command name in parentheses, which may itself hold spaces or ')').
bool IsStopped(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)),
                   std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  const char state = stat[close + 2];
  return state == 'T' || state == 't';
}

// Moves the child's output into the launcher's; false at EOF.
bool Drain(Child* c, int* fd, std::string* buf, int out) {
  char tmp[65536];
  ssize_t n = read(*fd, tmp, sizeof(tmp));
  if (n > 0) {
    buf->append(tmp, static_cast<size_t>(n));
    EmitLines(c->rank, buf, out, false);
    return true;
  }
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  EmitLines(c->rank, buf, out, true);
  close(*fd);
  *fd = -1;
  return false;
}

// Each child leads its own process group, so signals reach its children too.
void SignalAll(std::vector<Child>& children, int sig) {
  for (Child& c : children) {
    if (c.running) kill(-c.pid, sig);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Accept torchrun's dashed spellings (--nproc-per-node) before "--".
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size() && args[i] != "--"; ++i) {
    std::string& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    for (size_t j = 2; j < a.size() && a[j] != '='; ++j) {
      if (a[j] == '-') a[j] = '_';
    }
  }
  std::vector<char*> fixed;
  for (std::string& a : args) fixed.push_back(&a[0]);
  absl::SetProgramUsageMessage(
      "tools/launch --nproc_per_node N [--nnodes M --node_rank R "
      "--master_addr A --master_port P --rdzv-secret-file FILE] -- "
      "PROGRAM ARGS...");
  std::vector<char*> rest =
      absl::ParseCommandLine(static_cast<int>(fixed.size()), fixed.data());
  // rest[0] is the launcher; the program follows "--".
  std::vector<char*> program(rest.begin() + 1, rest.end());
  if (program.empty()) {
    Log("no program given: tools/launch --nproc_per_node N -- PROGRAM ARGS...");
    return 2;
  }
  const int nproc = absl::GetFlag(FLAGS_nproc_per_node);
  const int nnodes = absl::GetFlag(FLAGS_nnodes);
  const int node_rank = absl::GetFlag(FLAGS_node_rank);
  if (nproc < 1 || nnodes < 1 || node_rank < 0 || node_rank >= nnodes) {
    Log(absl::StrCat("bad sizes: --nproc_per_node ", nproc, " --nnodes ",
                     nnodes, " --node_rank ", node_rank));
    return 2;
  }
  const int fixed_port = absl::GetFlag(FLAGS_master_port);
  if (fixed_port == 0 && nnodes > 1) {
    Log("--master_port is required with more than one node");
    return 2;
  }
  const std::string master_addr = absl::GetFlag(FLAGS_master_addr);
  std::string job_id = absl::GetFlag(FLAGS_rdzv_id);
  if (job_id.empty() && nnodes == 1) {
    job_id = mcc::comm::RandomJobId();
  }
  // The job's secret: a file every node reads (the ranks read it too, so
  // the secret itself is not copied into their environments), or one
  // inherited from the environment, or a fresh one on one node.
  std::string secret_file = absl::GetFlag(FLAGS_rdzv_secret_file);
  std::string secret;
  const char* env_secret = std::getenv(mcc::comm::kJobSecretEnv);
  const char* env_secret_file = std::getenv(mcc::comm::kJobSecretFileEnv);
  if (secret_file.empty() && (env_secret == nullptr || *env_secret == '\0') &&
      env_secret_file != nullptr && *env_secret_file != '\0') {
    secret_file = env_secret_file;
  }
  if (!secret_file.empty()) {
    // Checked here, before any rank starts.
    absl::StatusOr<std::string> content =
        mcc::comm::ReadJobSecretFile(secret_file);
    if (!content.ok()) {
      Log(std::string(content.status().message()));
      return 2;
    }
    struct stat st;
    if (stat(secret_file.c_str(), &st) == 0 && (st.st_mode & 077) != 0) {
      Log(absl::StrFormat(
          "warning: the job secret file %s can be read by other users "
          "(mode %04o): chmod 600 it",
          secret_file, st.st_mode & 07777));
    }
    if (char* absolute = realpath(secret_file.c_str(), nullptr)) {
      secret_file = absolute;  // Ranks that change directory still find it.
      free(absolute);
    }
  } else if (env_secret != nullptr && *env_secret != '\0') {
    secret = env_secret;
  } else if (nnodes == 1) {
    absl::StatusOr<std::string> random = mcc::comm::RandomSecretHex();
    if (!random.ok()) {
      Log(std::string(random.status().message()));
      return 2;
    }
    secret = *random;
  } else {
    Log(absl::StrCat(
        "warning: no job secret (--rdzv-secret-file, MCC_JOB_SECRET or "
        "MCC_JOB_SECRET_FILE): rank 0's store on ",
        master_addr, ":", fixed_port,
        " will serve anyone who reaches it; give every node the same "
        "--rdzv-secret-file"));
  }
  const absl::Duration rank_exit_timeout =
      absl::Seconds(std::max(0.0, absl::GetFlag(FLAGS_rank_exit_timeout_s)));
  const absl::Duration grace = absl::Seconds(
      std::min(25.0, std::max(0.0, absl::GetFlag(FLAGS_grace_period_s))));

  if (pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return 2;
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // One run of the job; returns how it ended.
  struct Outcome {
    int exit_code = 0;
    int failed_rank = -1;     // The first rank that failed, or -1.
    int received_signal = 0;  // A signal the launcher got (no restart).
  };
  const int world = nproc * nnodes;
  // Node 0 holds the store's port from now until rank 0 serves on it. Only a
  // port in use is an error here: an address this machine cannot listen on
  // is left for rank 0 to report, as before.
  auto reserve_port = [&]() -> absl::StatusOr<mcc::comm::PortReservation> {
    if (node_rank != 0) return mcc::comm::PortReservation();
    absl::StatusOr<mcc::comm::PortReservation> reservation =
        mcc::comm::PortReservation::Listen(master_addr, fixed_port);
    if (reservation.ok()) return reservation;
    if (fixed_port == 0 ||
        reservation.status().code() != absl::StatusCode::kAlreadyExists) {
      return mcc::comm::PortReservation();
    }
    return absl::AlreadyExistsError(absl::StrCat(
        "cannot hold the rendezvous port for rank 0 (--master_addr ",
        master_addr, " --master_port ", fixed_port,
        "): it is in use, by another job? ", reservation.status().message()));
  };
  auto run_once = [&](int attempt) -> Outcome {
    absl::StatusOr<mcc::comm::PortReservation> reservation = reserve_port();
    if (!reservation.ok()) {
      Log(std::string(reservation.status().message()));
      return Outcome{2, -1, 0};
    }
    int port = reservation->held() ? reservation->port() : fixed_port;
    if (port == 0) {
      // Not listenable here: a port free on loopback, for rank 0 to try.
      absl::StatusOr<int> free_port = mcc::comm::FindFreePort();
      if (!free_port.ok()) {
        Log(std::string(free_port.status().message()));
        return Outcome{2, -1, 0};
      }
      port = *free_port;
    }
    std::vector<Child> children(nproc);
    for (int local = 0; local < nproc; ++local) {
      Child& c = children[local];
      c.rank = node_rank * nproc + local;
      int out[2], err[2];
      if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
        return Outcome{2, -1, 0};
      }
      pid_t pid = fork();
      if (pid < 0) {
        Log(absl::StrCat("fork failed: ", strerror(errno)));
        SignalAll(children, SIGKILL);
        return Outcome{2, -1, 0};
      }
      if (pid == 0) {
        setpgid(0, 0);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        dup2(out[1], 1);
        dup2(err[1], 2);
        setenv("RANK", std::to_string(c.rank).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        setenv("LOCAL_WORLD_SIZE", std::to_string(nproc).c_str(), 1);
        setenv("GROUP_RANK", std::to_string(node_rank).c_str(), 1);
        setenv("NODE_RANK", std::to_string(node_rank).c_str(), 1);
        setenv("MASTER_ADDR", master_addr.c_str(), 1);
        setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        if (job_id.empty()) {
          unsetenv(mcc::comm::kJobIdEnv);
        } else {
          setenv(mcc::comm::kJobIdEnv, job_id.c_str(), 1);
        }
        if (!secret_file.empty()) {
          setenv(mcc::comm::kJobSecretFileEnv, secret_file.c_str(), 1);
          unsetenv(mcc::comm::kJobSecretEnv);
        } else if (!secret.empty()) {
          setenv(mcc::comm::kJobSecretEnv, secret.c_str(), 1);
          unsetenv(mcc::comm::kJobSecretFileEnv);
        }
        unsetenv(mcc::comm::kStoreListenFdEnv);
        if (c.rank == 0) reservation->HandToChild();
        setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt).c_str(),
               1);
        std::vector<char*> cargv = program;
        cargv.push_back(nullptr);
        execvp(cargv[0], cargv.data());
        fprintf(stderr, "cannot run %s: %s\n", cargv[0], strerror(errno));
        _exit(127);
      }
      setpgid(pid, pid);
      close(out[1]);
      close(err[1]);
      c.pid = pid;
      c.out_fd = out[0];
      c.err_fd = err[0];
      c.running = true;
    }
    reservation->Release();  // Rank 0 has it now.

    int running = nproc;
    int failed_rank = -1;
    int exit_code = 0;
    int received_signal = 0;
    absl::Time kill_at = absl::InfiniteFuture();
    absl::Time first_clean_exit = absl::InfiniteFuture();
    bool killed = false;
    absl::Time all_exited_at = absl::InfiniteFuture();
    while (true) {
      std::vector<struct pollfd> fds;
      std::vector<std::pair<Child*, bool>> owners;  // (child, is_stdout)
      fds.push_back({signal_pipe[0], POLLIN, 0});
      owners.push_back({nullptr, false});
      for (Child& c : children) {
        if (c.out_fd >= 0) {
          fds.push_back({c.out_fd, POLLIN, 0});
          owners.push_back({&c, true});
        }
        if (c.err_fd >= 0) {
          fds.push_back({c.err_fd, POLLIN, 0});
          owners.push_back({&c, false});
        }
      }
      if (running == 0 && fds.size() == 1) break;
      poll(fds.data(), fds.size(), 50);
      for (size_t i = 0; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        if (owners[i].first == nullptr) {
          char sig = 0;
          while (read(signal_pipe[0], &sig, 1) == 1) {
            Log(absl::StrCat("got signal ", static_cast<int>(sig),
                             ", forwarding it to the ranks"));
            if (received_signal != 0) {
              SignalAll(children, SIGKILL);
              killed = true;
            } else {
              SignalAll(children, sig);
              kill_at = std::min(kill_at, absl::Now() + grace);
            }
            received_signal = sig;
          }
          continue;
        }
        Child* c = owners[i].first;
        if (owners[i].second) {
          Drain(c, &c->out_fd, &c->out_buf, 1);
        } else {
          Drain(c, &c->err_fd, &c->err_buf, 2);
        }
      }
      // Reap.
      while (running > 0) {
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        for (Child& c : children) {
          if (c.pid != pid || !c.running) continue;
          c.running = false;
          --running;
          c.exit_code =
              WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          if (c.exit_code == 0 && first_clean_exit == absl::InfiniteFuture()) {
            first_clean_exit = absl::Now();
          }
          if (c.exit_code != 0 && failed_rank < 0 && received_signal == 0) {
            failed_rank = c.rank;
            exit_code = c.exit_code;
            Log(absl::StrCat("rank ", c.rank, " (pid ", c.pid,
                             ") exited with code ", c.exit_code,
                             "; stopping the other ranks"));
            SignalAll(children, SIGTERM);
            kill_at = absl::Now() + grace;
          }
        }
      }
      if (running > 0 && failed_rank < 0 && received_signal == 0 &&
          absl::Now() >= first_clean_exit + rank_exit_timeout) {
        for (Child& c : children) {
          if (!c.running) continue;
          if (failed_rank < 0) {
            failed_rank = c.rank;
            exit_code = 1;
          }
          Log(absl::StrCat("rank ", c.rank, " (pid ", c.pid,
                           ") is still running ",
                           absl::FormatDuration(rank_exit_timeout),
                           " after another rank exited 0 (stopped, or hung "
                           "in its teardown; --rank-exit-timeout-s); "
                           "stopping it"));
        }
        SignalAll(children, SIGTERM);
        // SIGTERM waits in a stopped process; SIGKILL after the grace.
        kill_at = absl::Now() + grace;
      }
      if (!killed && running > 0 && absl::Now() >= kill_at) {
        // A stopped rank (a hung node, as SIGSTOP makes one) holds SIGTERM
        // until it runs again: name it, as the flight recorder cannot when
        // it stopped before the first collective.
        for (const Child& c : children) {
          if (c.running && IsStopped(c.pid)) {
            Log(absl::StrCat("rank ", c.rank, " (pid ", c.pid,
                             ") is stopped (SIGSTOP or a debugger)"));
          }
        }
        Log(absl::StrCat("ranks still running after the grace period of ",
                         absl::FormatDuration(grace), "; sending SIGKILL"));
        SignalAll(children, SIGKILL);
        killed = true;
      }
      // Output pipes may be held open by grandchildren after a rank is gone.
      if (running == 0 && all_exited_at == absl::InfiniteFuture()) {
        all_exited_at = absl::Now();
      }
      if (running == 0 && absl::Now() >= all_exited_at + absl::Seconds(2)) {
        for (Child& c : children) {
          EmitLines(c.rank, &c.out_buf, 1, true);
          EmitLines(c.rank, &c.err_buf, 2, true);
        }
        break;
      }
    }
    Outcome outcome{0, failed_rank, received_signal};
    if (failed_rank >= 0) {
      outcome.exit_code = exit_code;
    } else if (received_signal != 0) {
      // Every rank that handled the signal and exited 0 (train
      // --exit-signal-handler saves and does) ends the job cleanly: 0.
      // Otherwise the first rank's code that is not 0.
      outcome.exit_code = 0;
      for (Child& c : children) {
        if (c.exit_code != 0) {
          outcome.exit_code = c.exit_code;
          break;
        }
      }
      if (outcome.exit_code == 0) {
        Log(absl::StrCat("every rank exited 0 after signal ", received_signal));
      }
    }
    return outcome;
  };

  const int max_restarts = std::max(0, absl::GetFlag(FLAGS_max_restarts));
  for (int attempt = 0;; ++attempt) {
    const Outcome outcome = run_once(attempt);
    if (outcome.failed_rank < 0 || outcome.received_signal != 0 ||
        attempt >= max_restarts) {
      if (outcome.failed_rank >= 0 && max_restarts > 0) {
        Log(absl::StrCat("rank ", outcome.failed_rank, " failed and all ",
                         max_restarts,
                         " restarts (--max-restarts) are used; "
                         "giving up"));
      }
      return outcome.exit_code;
    }
    Log(absl::StrCat("rank ", outcome.failed_rank,
                     " failed; restarting the job (restart ", attempt + 1,
                     " of ", max_restarts, ")"));
    // Without --master_port each attempt holds a fresh port: the old store's
    // may linger in TIME_WAIT.
  }
}
