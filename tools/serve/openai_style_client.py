"""Chat checks of a live tools/serve with the requests the official `openai`
Python package sends (it is not installed here), byte for byte in what
matters: the paths under base_url "http://HOST:PORT/v1", the headers
(Authorization: Bearer, Content-Type and Accept JSON, User-Agent and the
X-Stainless-* set), the JSON bodies of client.chat.completions.create and
client.models.list, and the server-sent events the client's Stream reads.
Every answer is checked against the fields the package's types require.

Usage: openai_style_client.py PORT RENDERED_PROMPT_FILE
RENDERED_PROMPT_FILE holds the test's conversation rendered by hand with the
server's template; greedy chat must equal /v1/completions on that text.
"""

import http.client
import json
import sys

PORT = int(sys.argv[1])
RENDERED = open(sys.argv[2], encoding="utf-8").read()
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Name a color."},
]
HEADERS = {
    "Authorization": "Bearer sk-test",
    "Content-Type": "application/json",
    "Accept": "application/json",
    "User-Agent": "OpenAI/Python 1.54.0",
    "X-Stainless-Lang": "python",
    "X-Stainless-Package-Version": "1.54.0",
    "X-Stainless-OS": "Linux",
    "X-Stainless-Arch": "x64",
    "X-Stainless-Runtime": "CPython",
    "X-Stainless-Runtime-Version": "3.11.2",
    "X-Stainless-Async": "false",
    "X-Stainless-Retry-Count": "0",
}


def fail(message):
    print("FAILED: " + message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def send(method, path, body=None, stream=False):
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=120)
    headers = dict(HEADERS)
    if stream:
        headers["Accept"] = "text/event-stream"
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, "/v1" + path, body=data, headers=headers)
    r = conn.getresponse()
    return r.status, r.getheader("Content-Type", ""), r.read().decode()


def check_completion(j):
    """The fields openai.types.chat.ChatCompletion requires."""
    for key, kind in (("id", str), ("created", int), ("model", str),
                      ("choices", list)):
        check(isinstance(j.get(key), kind), "ChatCompletion.%s: %r" % (key, j))
    check(j.get("object") == "chat.completion", "object: %r" % j)
    check(len(j["choices"]) == 1, "one choice: %r" % j)
    c = j["choices"][0]
    check(c.get("index") == 0, "index: %r" % c)
    check(c.get("finish_reason") in ("stop", "length"), "finish: %r" % c)
    check(c["message"].get("role") == "assistant", "role: %r" % c)
    check(isinstance(c["message"].get("content"), str), "content: %r" % c)
    u = j["usage"]
    check(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"],
          "usage: %r" % u)
    return c["message"]["content"], c["finish_reason"], u


def events(text):
    """The data of each server-sent event, as the package's SSE decoder."""
    out = []
    for block in text.split("\n\n"):
        data = [l[len("data: "):] for l in block.split("\n")
                if l.startswith("data: ")]
        if data:
            out.append("\n".join(data))
    return out


def main():
    # client.models.list()
    status, _, text = send("GET", "/models")
    check(status == 200, "models: %d %s" % (status, text))
    models = json.loads(text)
    check(models.get("object") == "list" and models["data"], "list: " + text)
    model = models["data"][0]
    for key, kind in (("id", str), ("created", int), ("owned_by", str)):
        check(isinstance(model.get(key), kind), "Model.%s: %s" % (key, text))
    check(model.get("object") == "model", "Model.object: " + text)

    # client.chat.completions.create(model=..., messages=..., max_tokens=8,
    # temperature=0)
    body = {"messages": MESSAGES, "model": model["id"], "max_tokens": 8,
            "temperature": 0}
    status, ctype, text = send("POST", "/chat/completions", body)
    check(status == 200, "chat: %d %s" % (status, text))
    check(ctype.startswith("application/json"), "chat type: " + ctype)
    content, finish, usage = check_completion(json.loads(text))

    # The same prompt rendered by hand through /v1/completions.
    status, _, text = send("POST", "/completions", {
        "prompt": RENDERED, "max_tokens": 8, "temperature": 0,
        "stop": ["<|im_end|>"]})
    check(status == 200, "completions: %d %s" % (status, text))
    plain = json.loads(text)
    check(plain["choices"][0]["text"] == content,
          "chat %r != completions %r" % (content, plain["choices"][0]["text"]))
    check(plain["usage"]["prompt_tokens"] == usage["prompt_tokens"],
          "prompt tokens: %r vs %r" % (plain["usage"], usage))

    # stream=True, stream_options={"include_usage": True}
    body = {"messages": MESSAGES, "model": model["id"], "max_tokens": 8,
            "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    status, ctype, text = send("POST", "/chat/completions", body, stream=True)
    check(status == 200, "stream: %d %s" % (status, text))
    check(ctype.startswith("text/event-stream"), "stream type: " + ctype)
    data = events(text)
    check(data and data[-1] == "[DONE]", "stream end: %r" % data[-1:])
    streamed, reasons, role, usage_seen = "", [], None, None
    for d in data[:-1]:
        chunk = json.loads(d)
        check(chunk.get("object") == "chat.completion.chunk", "chunk: " + d)
        for key, kind in (("id", str), ("created", int), ("model", str),
                          ("choices", list)):
            check(isinstance(chunk.get(key), kind), "chunk.%s: %s" % (key, d))
        if chunk.get("usage"):
            usage_seen = chunk["usage"]
        for c in chunk["choices"]:
            check(c.get("index") == 0 and "delta" in c, "choice: " + d)
            role = c["delta"].get("role", role)
            streamed += c["delta"].get("content") or ""
            if c.get("finish_reason") is not None:
                reasons.append(c["finish_reason"])
    check(role == "assistant", "streamed role: %r" % role)
    check(streamed == content, "streamed %r != %r" % (streamed, content))
    check(reasons == [finish], "finish reasons: %r" % reasons)
    check(usage_seen == usage, "streamed usage %r != %r" % (usage_seen, usage))

    # An error the package raises as BadRequestError: 400 with error.message.
    status, _, text = send("POST", "/chat/completions",
                           {"model": model["id"], "messages": []})
    check(status == 400 and "messages" in json.loads(text)["error"]["message"],
          "empty messages: %d %s" % (status, text))
    print("all chat client checks passed: %r" % content)


main()
