"""Real-client checks of a live tools/serve, with Python's standard library.

Usage: serve_client_test.py PORT [--context N] [--max-body-bytes N]
Every field of PUT /api (Megatron) and POST /v1/completions (OpenAI-style),
streaming, every bad request, a client that disconnects mid-stream, and 64
concurrent requests of mixed lengths whose outputs equal the same requests
run one at a time. Exits non-zero with a message on the first failure.
"""

import argparse
import http.client
import json
import socket
import sys
import threading
import urllib.error
import urllib.request

BASE = ""
EOD = 256  # The byte tokenizer's end of document (and BOS).


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def request(method, path, body=None, raw=None):
    """(status, parsed JSON or text) of one request."""
    data = raw if raw is not None else (
        None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(BASE + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def api(body):
    return request("PUT", "/api", body)


def completions(body):
    return request("POST", "/v1/completions", body)


def expect_error(status, reply, code, words, what):
    check(status == code, "%s: status %d, want %d (%r)" %
          (what, status, code, reply))
    text = json.dumps(reply)
    check(words in text, "%s: %r does not say %r" % (what, reply, words))


def test_health_and_metrics():
    status, reply = request("GET", "/health")
    check(status == 200 and reply == {"status": "ok"}, "health: %r" % reply)
    status, text = request("GET", "/metrics")
    check(status == 200, "metrics status %d" % status)
    for name in ["serve_requests_total", "serve_prompt_tokens_total",
                 "serve_output_tokens_total", "serve_queue_depth",
                 "serve_batch_size_bucket", "serve_time_to_first_token_seconds",
                 "serve_inter_token_latency_seconds{quantile=\"0.99\"}",
                 "serve_step_model_seconds{quantile=\"0.5\"}",
                 "serve_step_after_model_seconds_count"]:
        check(name in text, "metrics lacks %s" % name)
    # Steps ran (the earlier tests generated): each has its model time.
    check(metric("serve_step_model_seconds_count") >= 1 or
          metric("serve_steps_total") == 0, "no step's model time recorded")


def metric(name):
    _, text = request("GET", "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    fail("no metric " + name)


def test_megatron_api():
    prompts = ["Hello, world", "abc"]
    status, r = api({"prompts": prompts, "tokens_to_generate": 6,
                     "top_k": 1, "logprobs": True})
    check(status == 200, "api: %d %r" % (status, r))
    for key in ["text", "segments", "tokens", "logprobs"]:
        check(key in r and len(r[key]) == 2, "api lacks %s: %r" % (key, r))
    for i, p in enumerate(prompts):
        check(r["text"][i].startswith(p), "text %r lacks prompt" % r["text"][i])
        tokens, segments, logprobs = (r["tokens"][i], r["segments"][i],
                                      r["logprobs"][i])
        check(tokens[:len(p)] == list(p.encode()),
              "tokens do not start with the prompt's bytes: %r" % tokens)
        check(len(tokens) <= len(p) + 6, "too many tokens: %r" % tokens)
        check(len(segments) == len(tokens), "one segment per token")
        check("".join(segments) == r["text"][i],
              "segments %r do not make the text" % segments)
        check(len(logprobs) == len(tokens) - 1,
              "logprobs: %d for %d tokens" % (len(logprobs), len(tokens)))
        check(all(v <= 0 for v in logprobs), "a log-probability above 0")
    # top_k 1 is greedy: the same whatever the seed.
    _, again = api({"prompts": prompts, "tokens_to_generate": 6, "top_k": 1,
                    "random_seed": 77})
    check(again["text"] == r["text"], "greedy changed with the seed")
    check("logprobs" not in again, "logprobs without asking")
    # A seed makes sampling repeatable; temperature and top_p are used.
    body = {"prompts": ["xyz"], "tokens_to_generate": 12, "temperature": 1.5,
            "top_p": 0.95, "random_seed": 1234}
    _, s1 = api(body)
    _, s2 = api(body)
    check(s1["text"] == s2["text"], "seeded sampling not repeatable")
    texts = set(api(dict(body, random_seed=seed))[1]["text"][0]
                for seed in range(5))
    check(len(texts) > 1, "five seeds sampled one text: %r" % texts)
    # add_BOS puts the end-of-document token first; an empty prompt needs it.
    status, b = api({"prompts": ["", "hi"], "tokens_to_generate": 2,
                     "add_BOS": True, "top_k": 1})
    check(status == 200 and b["tokens"][0][0] == EOD and
          b["tokens"][1][:3] == [EOD, ord("h"), ord("i")], "add_BOS: %r" % b)
    # tokens_to_generate 0 with logprobs scores the prompt alone.
    status, z = api({"prompts": ["scoring"], "tokens_to_generate": 0,
                     "logprobs": True})
    check(status == 200 and z["text"] == ["scoring"] and
          len(z["logprobs"][0]) == len("scoring") - 1, "scoring: %r" % z)
    check(all(abs(a - b) < 1e-9 for a, b in zip(
        z["logprobs"][0],
        api({"prompts": ["scoring"], "tokens_to_generate": 1, "top_k": 1,
             "logprobs": True})[1]["logprobs"][0])),
        "prompt log-probabilities depend on tokens_to_generate")
    return r


def test_megatron_bad_requests(context):
    cases = [
        ({}, "prompts is required"),
        ({"prompts": "abc"}, "list of strings"),
        ({"prompts": []}, "empty"),
        ({"prompts": [1, 2]}, "list of strings"),
        ({"prompts": ["a"] * 129}, "128"),
        ({"prompts": ["a"], "tokens_to_generate": "5"}, "integer"),
        ({"prompts": ["a"], "tokens_to_generate": -1}, ">= 0"),
        ({"prompts": ["a"], "tokens_to_generate": 0}, "logprobs"),
        ({"prompts": ["a"], "temperature": 0}, "temperature"),
        ({"prompts": ["a"], "temperature": "hot"}, "number"),
        ({"prompts": ["a"], "top_k": 5, "top_p": 0.5}, "both"),
        ({"prompts": ["a"], "top_k": 1.5}, "integer"),
        ({"prompts": ["a"], "top_p": 2.0}, "top_p"),
        ({"prompts": ["a"], "logprobs": "yes"}, "boolean"),
        ({"prompts": ["a"], "add_BOS": 1}, "boolean"),
        ({"prompts": [""]}, "add_BOS"),
        ({"prompts": ["a"], "random_seed": -3}, "random_seed"),
        ({"prompts": ["a"], "max_len": 5}, "tokens_to_generate"),
        ({"prompts": ["a"], "tokens_to_generate": 10 ** 9}, "context"),
        ({"prompts": ["x" * (context + 5)]}, "context"),
    ]
    for body, words in cases:
        status, reply = api(body)
        expect_error(status, reply, 400, words, "api %r" % (body,))
    status, reply = request("PUT", "/api", raw=b"{not json")
    expect_error(status, reply, 400, "not valid JSON", "api malformed")
    status, reply = request("PUT", "/api", raw=b"[1, 2]")
    expect_error(status, reply, 400, "JSON object", "api array body")


def read_stream(body):
    """The parsed events of a streamed completion, and whether [DONE] came."""
    req = urllib.request.Request(BASE + "/v1/completions",
                                 data=json.dumps(body).encode(), method="POST")
    events, done = [], False
    with urllib.request.urlopen(req, timeout=120) as r:
        check(r.headers.get("Content-Type", "").startswith("text/event-stream"),
              "stream content type %r" % r.headers.get("Content-Type"))
        for raw in r:
            line = raw.decode().rstrip("\n")
            if not line:
                continue
            check(line.startswith("data: "), "not an SSE line: %r" % line)
            payload = line[len("data: "):]
            if payload == "[DONE]":
                done = True
                continue
            check(not done, "an event after [DONE]")
            events.append(json.loads(payload))
    return events, done


def test_completions(greedy_api_reply):
    # Greedy: the same continuation as the Megatron API's top_k 1.
    status, r = completions({"prompt": "Hello, world", "max_tokens": 6,
                             "temperature": 0, "model": "m1"})
    check(status == 200, "completions: %d %r" % (status, r))
    check(r["object"] == "text_completion" and r["model"] == "m1" and
          r["id"].startswith("cmpl-") and isinstance(r["created"], int),
          "completion envelope: %r" % r)
    choice = r["choices"][0]
    check(choice["index"] == 0 and choice["logprobs"] is None and
          choice["finish_reason"] in ("length", "stop"), "choice: %r" % choice)
    check("Hello, world" + choice["text"] == greedy_api_reply["text"][0],
          "completions and /api disagree: %r vs %r" %
          (choice["text"], greedy_api_reply["text"][0]))
    usage = r["usage"]
    check(usage["prompt_tokens"] == len("Hello, world") and
          usage["total_tokens"] ==
          usage["prompt_tokens"] + usage["completion_tokens"], "usage %r" % usage)
    # A list of prompts, logprobs, top_p and seed.
    body = {"prompt": ["abc", "defg"], "max_tokens": 5, "temperature": 0.9,
            "top_p": 0.9, "seed": 7, "logprobs": 1}
    status, r = completions(body)
    check(status == 200 and len(r["choices"]) == 2, "list prompt: %r" % r)
    for i, c in enumerate(r["choices"]):
        check(c["index"] == i, "choice index")
        lp = c["logprobs"]
        check(len(lp["tokens"]) == len(lp["token_logprobs"]) ==
              len(lp["text_offset"]), "logprobs fields: %r" % lp)
    check(completions(body)[1]["choices"] == r["choices"],
          "seeded completion not repeatable")
    # Stop strings cut the text.
    _, plain = completions({"prompt": "Hello", "max_tokens": 12,
                            "temperature": 0})
    text = plain["choices"][0]["text"]
    if len(text) >= 4:
        stop = text[2:4]
        _, cut = completions({"prompt": "Hello", "max_tokens": 12,
                              "temperature": 0, "stop": [stop, "\x00zz"]})
        c = cut["choices"][0]
        check(c["text"] == text[:text.find(stop)] and
              c["finish_reason"] == "stop", "stop: %r in %r" % (c, text))
        _, cut1 = completions({"prompt": "Hello", "max_tokens": 12,
                               "temperature": 0, "stop": stop})
        check(cut1["choices"][0]["text"] == c["text"], "stop as a string")
    # Streaming: one event per token, the same text, then [DONE].
    body = {"prompt": "Hello", "max_tokens": 8, "temperature": 0.7, "seed": 3}
    _, whole = completions(body)
    events, done = read_stream(dict(body, stream=True))
    check(done, "no [DONE]")
    token_events = [e for e in events
                    if e["choices"][0]["finish_reason"] is None]
    finals = [e for e in events if e["choices"][0]["finish_reason"]]
    check(len(token_events) == whole["usage"]["completion_tokens"],
          "%d token events for %d tokens" %
          (len(token_events), whole["usage"]["completion_tokens"]))
    check(len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] ==
          whole["choices"][0]["finish_reason"], "final event: %r" % finals)
    streamed = "".join(e["choices"][0]["text"] for e in events)
    check(streamed == whole["choices"][0]["text"],
          "streamed %r != %r" % (streamed, whole["choices"][0]["text"]))
    for e in events:
        check(e["object"] == "text_completion" and e["id"].startswith("cmpl-"),
              "event envelope %r" % e)
    # Streaming two prompts: each index finishes once.
    events, done = read_stream({"prompt": ["a", "b"], "max_tokens": 3,
                                "temperature": 0, "stream": True})
    ends = sorted(e["choices"][0]["index"] for e in events
                  if e["choices"][0]["finish_reason"])
    check(done and ends == [0, 1], "two-prompt stream ends: %r" % ends)


def test_completions_bad_requests(context, max_body):
    cases = [
        ({}, "prompt is required"),
        ({"prompt": 5}, "string"),
        ({"prompt": []}, "non-empty"),
        ({"prompt": ["a", 3]}, "string"),
        ({"prompt": "a", "max_tokens": 0}, "at least 1"),
        ({"prompt": "a", "max_tokens": "5"}, "integer"),
        ({"prompt": "a", "max_tokens": 10 ** 9}, "context"),
        ({"prompt": "x" * (context + 5)}, "context"),
        ({"prompt": "a", "temperature": "hot"}, "number"),
        ({"prompt": "a", "temperature": 3}, "temperature"),
        ({"prompt": "a", "top_p": 0}, "top_p"),
        ({"prompt": "a", "stop": 5}, "stop"),
        ({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": "a", "seed": -1}, "seed"),
        ({"prompt": "a", "seed": "x"}, "integer"),
        ({"prompt": "a", "stream": "yes"}, "boolean"),
        ({"prompt": "a", "logprobs": 9}, "logprobs"),
        ({"prompt": "a", "n": 2}, "n must be 1"),
        ({"prompt": "a", "model": 3}, "model"),
    ]
    for body, words in cases:
        status, reply = completions(body)
        expect_error(status, reply, 400, words, "completions %r" % (body,))
        check(reply["error"]["code"] == 400, "error code field")
    status, reply = request("POST", "/v1/completions", raw=b'{"prompt": "a",')
    expect_error(status, reply, 400, "not valid JSON", "malformed JSON")
    status, reply = request("GET", "/v2/nothing")
    expect_error(status, reply, 404, "no endpoint", "unknown endpoint")
    status, reply = request("DELETE", "/api")
    check(status in (404, 405), "DELETE /api: %d" % status)
    status, reply = request("POST", "/v1/completions",
                            raw=b'{"prompt": "' + b"a" * (max_body + 10) + b'"}')
    expect_error(status, reply, 413, "larger than", "body over the limit")


def test_disconnect_mid_stream():
    """A client that goes away mid-stream: its generation is cancelled and
    the server keeps serving."""
    host, port = BASE[len("http://"):].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(
        {"prompt": "a long one", "max_tokens": 40, "temperature": 0,
         "stream": True}))
    r = conn.getresponse()
    check(r.status == 200, "stream status %d" % r.status)
    first = r.readline()
    check(first.startswith(b"data: "), "first line %r" % first)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    status, reply = completions({"prompt": "still there?", "max_tokens": 3,
                                 "temperature": 0})
    check(status == 200, "after a disconnect: %d %r" % (status, reply))
    # The abandoned generation leaves the batch.
    import time
    for _ in range(100):
        if metric("serve_running_sequences") == 0:
            break
        time.sleep(0.1)
    check(metric("serve_running_sequences") == 0, "a sequence is left running")


def concurrent_bodies():
    bodies = []
    for i in range(64):
        prompt = ("req%d " % i) + "xyzw" * (i % 9)
        body = {"prompt": prompt, "max_tokens": 2 + (i * 7) % 17}
        if i % 3 == 0:
            body["temperature"] = 0
        else:
            body.update(temperature=0.8 + (i % 4) * 0.1, seed=1000 + i)
            if i % 3 == 2:
                body["top_p"] = 0.9
        if i % 5 == 0:
            body["logprobs"] = 1
        bodies.append(body)
    return bodies


def test_concurrent_equals_one_at_a_time():
    bodies = concurrent_bodies()
    alone = []
    for b in bodies:
        status, r = completions(b)
        check(status == 200, "alone: %d %r" % (status, r))
        alone.append(r["choices"])
    before = metric("serve_batch_size_count") - metric(
        'serve_batch_size_bucket{le="1"}')
    together = [None] * len(bodies)
    errors = []

    def run(i):
        try:
            status, r = completions(bodies[i])
            together[i] = r["choices"] if status == 200 else (status, r)
        except Exception as e:  # Reported below.
            errors.append("%d: %r" % (i, e))

    threads = [threading.Thread(target=run, args=(i,))
               for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "concurrent errors: %r" % errors)
    for i in range(len(bodies)):
        check(together[i] == alone[i],
              "request %d differs batched:\n%r\nalone:\n%r" %
              (i, together[i], alone[i]))
    batched = metric("serve_batch_size_count") - metric(
        'serve_batch_size_bucket{le="1"}') - before
    check(batched > 0, "64 concurrent requests never shared a step")
    print("64 concurrent requests equal one at a time; %d batched steps" %
          batched)


def main():
    global BASE
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    BASE = "http://127.0.0.1:%d" % args.port
    if args.only == "greedy":
        # For layout comparisons: print greedy replies of both APIs.
        _, r = api({"prompts": ["Hello, world", "abc"],
                    "tokens_to_generate": 10, "top_k": 1, "logprobs": True})
        print(json.dumps({"text": r["text"], "tokens": r["tokens"],
                          "logprobs": [[round(v, 4) for v in l]
                                       for l in r["logprobs"]]}))
        return
    if args.only == "concurrent":
        # Batch invariance alone: concurrent requests equal one at a time.
        test_concurrent_equals_one_at_a_time()
        print("concurrent requests equal one at a time")
        return
    test_health_and_metrics()
    greedy = test_megatron_api()
    test_megatron_bad_requests(args.context)
    test_completions(greedy)
    test_completions_bad_requests(args.context, args.max_body_bytes)
    test_disconnect_mid_stream()
    test_concurrent_equals_one_at_a_time()
    test_health_and_metrics()
    print("all client checks passed")


if __name__ == "__main__":
    main()
