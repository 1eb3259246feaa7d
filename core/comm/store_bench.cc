// Rendezvous store throughput with and without the job secret, measured in
// the same run: requests per second (Set then Get from 4 client threads,
// each on its own connection) and connections per second (connect, hello,
// goodbye: the secret adds the challenge round trip and two HMACs). Each
// round measures both stores back to back (the order alternating), so a
// shared machine's changing load touches both; the medians of the rounds
// and the median of the rounds' ratios are reported.
//
//   tools/bazel run -c opt //core/comm:store_bench
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/comm/tcp_store.h"
#include "glog/logging.h"

namespace {

using mcc::comm::TcpStore;

constexpr int kThreads = 4;
constexpr int kRounds = 9;
const absl::Duration kRoundTime = absl::Milliseconds(500);

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      return line.substr(line.find(':') + 2);
    }
  }
  return "unknown CPU";
}

TcpStore::Options ClientOptions(int port, const std::string& secret, int rank) {
  TcpStore::Options o;
  o.port = port;
  o.rank = rank;
  o.job_id = "bench";
  o.secret = secret;
  o.timeout = absl::Seconds(30);
  return o;
}

// Set + Get pairs from kThreads connections for one round: requests/s.
double RequestsPerSecond(int port, const std::string& secret) {
  std::atomic<int64_t> requests{0};
  std::vector<std::thread> threads;
  const absl::Time end = absl::Now() + kRoundTime;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::shared_ptr<TcpStore> c =
          TcpStore::Connect(ClientOptions(port, secret, t + 1)).value();
      const std::string key = "k" + std::to_string(t);
      int64_t n = 0;
      while (absl::Now() < end) {
        CHECK(c->Set(key, "value of 32 bytes, like an addr.").ok());
        CHECK(c->Get(key).status().ok());
        n += 2;
      }
      requests += n;
    });
  }
  for (std::thread& t : threads) t.join();
  return static_cast<double>(requests) / absl::ToDoubleSeconds(kRoundTime);
}

// Connect, hello and goodbye, one after another: connections/s.
double ConnectionsPerSecond(int port, const std::string& secret) {
  int64_t n = 0;
  const absl::Time end = absl::Now() + kRoundTime;
  while (absl::Now() < end) {
    CHECK(TcpStore::Connect(ClientOptions(port, secret, 1)).status().ok());
    ++n;
  }
  return static_cast<double>(n) / absl::ToDoubleSeconds(kRoundTime);
}

}  // namespace

int main(int argc, char** argv) {
  google::InitGoogleLogging(argv[0]);
  FLAGS_minloglevel = google::GLOG_ERROR;
  const std::string secrets[2] = {"", "a secret of the benchmark's job"};
  std::shared_ptr<TcpStore> servers[2];
  for (int i = 0; i < 2; ++i) {
    TcpStore::Options o = ClientOptions(0, secrets[i], 0);
    o.is_server = true;
    servers[i] = TcpStore::Connect(o).value();
  }
  std::vector<double> requests[2], connections[2], request_ratio,
      connection_ratio;
  for (int round = 0; round < kRounds; ++round) {
    for (int k = 0; k < 2; ++k) {
      const int i = (round + k) % 2;
      requests[i].push_back(RequestsPerSecond(servers[i]->port(), secrets[i]));
      connections[i].push_back(
          ConnectionsPerSecond(servers[i]->port(), secrets[i]));
    }
    request_ratio.push_back(requests[1].back() / requests[0].back());
    connection_ratio.push_back(connections[1].back() / connections[0].back());
  }
  printf(
      "rendezvous store on loopback, %s, %u hardware threads; median of %d "
      "rounds of %s each\n",
      CpuModel().c_str(), std::thread::hardware_concurrency(), kRounds,
      absl::FormatDuration(kRoundTime).c_str());
  printf("%-34s %12s %12s %8s\n", "", "no secret", "secret", "ratio");
  printf("%-34s %12.0f %12.0f %8.3f\n", "requests/s (4 connections)",
         Median(requests[0]), Median(requests[1]), Median(request_ratio));
  printf("%-34s %12.0f %12.0f %8.3f\n", "connections/s (connect+hello+bye)",
         Median(connections[0]), Median(connections[1]),
         Median(connection_ratio));
  return 0;
}
