#!/usr/bin/env bash
# Chat end to end, in real processes: tools/train makes a tiny checkpoint;
# tools/serve serves it with a ChatML tokenizer_config.json; curl and a
# client sending what the official openai package sends
# (openai_style_client.py) check POST /v1/chat/completions, streamed and
# not, and GET /v1/models; greedy chat equals the hand-rendered prompt sent
# to /v1/completions; a bad --tokenizer-config stops serve, naming it.
set -euo pipefail
train=$1
serve=$2
client=$3
hf_tokenizer=$4  # Qwen 2's layout, with <|im_start|> and <|im_end|>
qwen_template=$5
python=/usr/bin/python3
[[ -x $python ]] || python=python3
work=${TEST_TMPDIR:-$(mktemp -d)}
pid=
cleanup() { [[ -n $pid ]] && kill "$pid" 2>/dev/null || true; }
trap cleanup EXIT
fail() { echo "FAILED: $*"; exit 1; }

"$train" --mock-data --vocab-size 300 --num-layers 2 --hidden-size 32 \
  --num-attention-heads 2 --seq-length 256 --micro-batch-size 2 \
  --train-iters 2 --num-threads 1 --save "$work/ckpt" > "$work/train.log" 2>&1 ||
  { cat "$work/train.log"; fail "train"; }

mkdir -p "$work/chat"
cat > "$work/chat/tokenizer_config.json" <<'JSON'
{"chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
 "eos_token": "<|im_end|>", "bos_token": null}
JSON
printf '%s' $'<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi.<|im_end|>\n<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n' \
  > "$work/rendered.txt"

# A template serve cannot run: exit non-zero, naming the construct.
echo '{"chat_template": "{% macro m() %}{% endmacro %}"}' > "$work/bad.json"
if "$serve" --load "$work/ckpt" --port 0 --num-threads 1 \
    --tokenizer-config "$work/bad.json" > "$work/bad.log" 2>&1; then
  fail "serve ran with an unsupported template"
fi
grep -q "{% macro %} is not supported at 1:1" "$work/bad.log" ||
  fail "no reason given: $(cat "$work/bad.log")"

"$serve" --load "$work/ckpt" --port 0 --port-file "$work/port" --num-threads 1 \
  --tokenizer-config "$work/chat" > "$work/serve.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [[ -s $work/port ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve.log"; fail "serve exited"; }
  sleep 0.2
done
[[ -s $work/port ]] || { cat "$work/serve.log"; fail "serve never listened"; }
url=http://127.0.0.1:$(cat "$work/port")

out=$(curl -s "$url/v1/models")
grep -q '"object":"list"' <<< "$out" && grep -q '"id":"gpt"' <<< "$out" ||
  fail "curl /v1/models: $out"
body='{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0}'
out=$(curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$body")
grep -q '"object":"chat.completion"' <<< "$out" && grep -q '"role":"assistant"' <<< "$out" ||
  fail "curl chat: $out"
grep -q '"completion_tokens":4' <<< "$out" || fail "curl chat tokens: $out"
out=$(curl -sN "$url/v1/chat/completions" -d "${body%\}}, \"stream\": true}")
[[ $(grep -c '^data: {' <<< "$out") -ge 2 ]] || fail "curl chat stream: $out"
grep -q '"role":"assistant"' <<< "$out" || fail "curl chat role chunk: $out"
[[ $(grep -v '^$' <<< "$out" | tail -1) == "data: [DONE]" ]] || fail "curl chat stream end: $out"
code=$(curl -s -o "$work/err.json" -w '%{http_code}' "$url/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": {"x": 1}}]}')
[[ $code == 400 ]] && grep -q 'messages\[0\].content' "$work/err.json" ||
  fail "curl bad chat: $code $(cat "$work/err.json")"

"$python" "$client" "$(cat "$work/port")" "$work/rendered.txt" > "$work/client.log" 2>&1 ||
  { cat "$work/client.log"; fail "client"; }
grep -q "all chat client checks passed" "$work/client.log" || fail "client: $(cat "$work/client.log")"
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=

# A Hugging Face tokenizer.json and the real Qwen2.5 template: with a system
# message it renders the same ChatML, now with <|im_end|> one token.
"$train" --mock-data --vocab-size 3300 --num-layers 2 --hidden-size 32 \
  --num-attention-heads 2 --seq-length 256 --micro-batch-size 2 \
  --train-iters 2 --num-threads 1 --save "$work/ckpt_hf" > "$work/train_hf.log" 2>&1 ||
  { cat "$work/train_hf.log"; fail "train (vocabulary 3300)"; }
"$python" -c 'import json, sys; json.dump({"chat_template": open(sys.argv[1]).read(), "eos_token": "<|im_end|>"}, open(sys.argv[2], "w"))' \
  "$qwen_template" "$work/qwen_config.json"
rm -f "$work/port"
"$serve" --load "$work/ckpt_hf" --port 0 --port-file "$work/port" --num-threads 1 \
  --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$hf_tokenizer" \
  --tokenizer-config "$work/qwen_config.json" > "$work/serve_hf.log" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [[ -s $work/port ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/serve_hf.log"; fail "serve (HF) exited"; }
  sleep 0.2
done
[[ -s $work/port ]] || { cat "$work/serve_hf.log"; fail "serve (HF) never listened"; }
"$python" "$client" "$(cat "$work/port")" "$work/rendered.txt" > "$work/client_hf.log" 2>&1 ||
  { cat "$work/client_hf.log"; fail "client (HF)"; }
grep -q "all chat client checks passed" "$work/client_hf.log" || fail "client (HF): $(cat "$work/client_hf.log")"
kill "$pid"; wait "$pid" 2>/dev/null || true; pid=
echo "PASSED"
