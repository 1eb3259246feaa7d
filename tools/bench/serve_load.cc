// A load generator for tools/serve over loopback HTTP (a separate process
// from the server): --concurrency clients each send streamed completions
// (--prompt-tokens bytes of prompt, --max-tokens tokens, greedy, past the
// end of document) back to back for --seconds. Prints one JSON line:
// requests/s, output tokens/s, and p50/p99 time to first token and
// inter-token latency, measured at the client from the server-sent events.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "httplib.h"

ABSL_FLAG(int, port, 0, "The server's port on 127.0.0.1.");
ABSL_FLAG(int, concurrency, 1, "Clients sending at once.");
ABSL_FLAG(double, seconds, 10, "How long the clients keep sending.");
ABSL_FLAG(int, prompt_tokens, 32,
          "Prompt length (bytes of the byte tokenizer).");
ABSL_FLAG(int, max_tokens, 64, "Tokens generated per request.");
ABSL_FLAG(std::string, api_key, "",
          "Sent as Authorization: Bearer KEY (serve --api-key).");

namespace {

struct Totals {
  absl::Mutex mu;
  int64_t requests = 0, tokens = 0, errors = 0;
  std::vector<double> ttft, itl;
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100 * (v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(v.size() - 1, lo + 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - lo);
}

void Client(int id, absl::Time deadline, Totals* totals) {
  httplib::Client cli("127.0.0.1", absl::GetFlag(FLAGS_port));
  cli.set_read_timeout(600, 0);
  for (int n = 0; absl::Now() < deadline; ++n) {
    // Distinct prompts of one length.
    std::string prompt = absl::StrCat("client ", id, " request ", n, ": ");
    while (static_cast<int>(prompt.size()) <
           absl::GetFlag(FLAGS_prompt_tokens)) {
      prompt += static_cast<char>('a' + (prompt.size() * 7 + id) % 26);
    }
    prompt.resize(absl::GetFlag(FLAGS_prompt_tokens));
    const std::string body = absl::StrCat(
        R"({"prompt": ")", prompt, R"(", "max_tokens": )",
        absl::GetFlag(FLAGS_max_tokens),
        R"(, "temperature": 0, "stream": true, "ignore_eos": true})");
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body;
    req.set_header("Content-Type", "application/json");
    if (const std::string key = absl::GetFlag(FLAGS_api_key); !key.empty()) {
      req.set_header("Authorization", "Bearer " + key);
    }
    const absl::Time start = absl::Now();
    absl::Time last = start;
    bool first = true;
    int64_t tokens = 0;
    std::vector<double> ttft, itl;
    std::string pending;
    req.content_receiver = [&](const char* data, size_t len, uint64_t,
                               uint64_t) {
      pending.append(data, len);
      size_t end;
      while ((end = pending.find("\n\n")) != std::string::npos) {
        const std::string event = pending.substr(0, end);
        pending.erase(0, end + 2);
        if (event.find("\"finish_reason\":null") == std::string::npos) continue;
        const absl::Time now = absl::Now();
        (first ? ttft : itl).push_back(absl::ToDoubleSeconds(now - last));
        first = false;
        last = now;
        ++tokens;
      }
      return true;
    };
    auto res = cli.send(req);
    absl::MutexLock lock(&totals->mu);
    if (!res || res->status != 200) {
      ++totals->errors;
      continue;
    }
    ++totals->requests;
    totals->tokens += tokens;
    totals->ttft.insert(totals->ttft.end(), ttft.begin(), ttft.end());
    totals->itl.insert(totals->itl.end(), itl.begin(), itl.end());
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int clients = absl::GetFlag(FLAGS_concurrency);
  Totals totals;
  const absl::Time start = absl::Now();
  const absl::Time deadline =
      start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back(Client, i, deadline, &totals);
  }
  for (auto& t : threads) t.join();
  // Requests run to completion, so the window ends with the last one.
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf(
      "%s\n",
      absl::StrFormat(
          "{\"concurrency\": %d, \"seconds\": %.2f, \"requests\": %d, "
          "\"errors\": %d, \"requests_per_s\": %.3f, \"tokens_per_s\": %.2f, "
          "\"ttft_p50_ms\": %.2f, \"ttft_p99_ms\": %.2f, \"itl_p50_ms\": "
          "%.2f, \"itl_p99_ms\": %.2f}",
          clients, elapsed, totals.requests, totals.errors,
          totals.requests / elapsed, totals.tokens / elapsed,
          1e3 * Percentile(totals.ttft, 50), 1e3 * Percentile(totals.ttft, 99),
          1e3 * Percentile(totals.itl, 50), 1e3 * Percentile(totals.itl, 99))
          .c_str());
  return totals.requests > 0 ? 0 : 1;
}
