#!/usr/bin/env python3
"""Concurrent streaming clients against serve's /v1/completions.

C clients each send R requests one after another (greedy, ignore_eos, a
fixed prompt and max_tokens) and read the server-sent events as they come.
Prints one line per concurrency:

  SERVE LOAD clients 64: 5123.4 tokens/s, TTFT p50 45.1 ms p99 210.0 ms,
  inter-token p50 11.8 ms p99 14.9 ms (128 requests, 16384 tokens)

tokens/s is every output token over the wall time from the first request
sent to the last answer read; TTFT is request sent to first token event;
inter-token gaps are between consecutive token events of one request,
pooled over all requests. Standard library only.
"""
import argparse
import http.client
import json
import sys
import threading
import time


def percentile(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(p / 100.0 * (len(v) - 1)))))
    return v[k]


def one_request(port, body, timeout):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    start = time.monotonic()
    conn.request("POST", "/v1/completions", body=body,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read()[:200]))
    times = []
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        now = time.monotonic()
        choice = json.loads(line[6:])["choices"][0]
        # The last event closes the stream (finish_reason) without a token.
        if choice.get("finish_reason") and not choice.get("text"):
            continue
        times.append(now)
    conn.close()
    return start, times


def run(port, clients, requests, body, timeout):
    ttft, gaps, tokens, errors = [], [], [0], []
    lock = threading.Lock()

    def client():
        for _ in range(requests):
            try:
                start, times = one_request(port, body, timeout)
            except Exception as e:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(str(e))
                return
            with lock:
                if times:
                    ttft.append(times[0] - start)
                    gaps.extend(b - a for a, b in zip(times, times[1:]))
                tokens[0] += len(times)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"clients": clients, "requests": clients * requests,
            "tokens": tokens[0], "seconds": wall,
            "tokens_per_s": tokens[0] / wall if wall > 0 else 0.0,
            "ttft_p50_ms": 1e3 * percentile(ttft, 50),
            "ttft_p99_ms": 1e3 * percentile(ttft, 99),
            "itl_p50_ms": 1e3 * percentile(gaps, 50),
            "itl_p99_ms": 1e3 * percentile(gaps, 99),
            "errors": errors[:3]}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--clients", default="1 16 64")
    p.add_argument("--requests", type=int, default=2,
                   help="requests per client, one after another")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-chars", type=int, default=128)
    p.add_argument("--timeout", type=float, default=300)
    args = p.parse_args()
    prompt = ("The quick brown fox jumps over the lazy dog. " *
              (args.prompt_chars // 44 + 1))[:args.prompt_chars]
    body = json.dumps({"prompt": prompt, "max_tokens": args.max_tokens,
                       "temperature": 0, "ignore_eos": True,
                       "stream": True})
    failed = False
    for c in [int(x) for x in args.clients.split()]:
        r = run(args.port, c, args.requests, body, args.timeout)
        print("SERVE LOAD clients %d: %.1f tokens/s, TTFT p50 %.1f ms p99 "
              "%.1f ms, inter-token p50 %.1f ms p99 %.1f ms (%d requests, "
              "%d tokens)" % (c, r["tokens_per_s"], r["ttft_p50_ms"],
                              r["ttft_p99_ms"], r["itl_p50_ms"],
                              r["itl_p99_ms"], r["requests"], r["tokens"]))
        print("SERVE LOAD JSON " + json.dumps(r))
        sys.stdout.flush()
        if r["errors"] or r["tokens"] == 0:
            print("SERVE LOAD errors: %r" % (r["errors"],))
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
