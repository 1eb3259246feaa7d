#!/usr/bin/env bash
# preprocess_data with stdout and stderr not a terminal (files): no '\r'
# progress line anywhere, one summary line on stdout with the counts, and
# --log-interval lines on stderr.
set -euo pipefail
preprocess=$1
work=${TEST_TMPDIR:-$(mktemp -d)}
for i in $(seq 1 250); do
  printf '{"id": %d, "text": "document number %d \\u00e9"}\n' "$i" "$i"
done > "$work/in.jsonl"
bytes=$(stat -c %s "$work/in.jsonl")

"$preprocess" --input "$work/in.jsonl" --output-prefix "$work/out" \
  --tokenizer-type ByteTokenizer --workers 2 --log-interval 100 \
  > "$work/stdout" 2> "$work/stderr" || { cat "$work/stderr"; exit 1; }

fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$work/stdout";
         echo "--- stderr"; cat "$work/stderr"; exit 1; }
if grep -q $'\r' "$work/stdout" "$work/stderr"; then fail "a '\\r' line"; fi
[[ $(wc -l < "$work/stdout") == 1 ]] || fail "not one summary line"
mb=$(awk -v b="$bytes" 'BEGIN { printf "%.2f", b / 1e6 }')
grep -Eq "^preprocess_data: 250 documents, $mb MB in [0-9.]+ s: [0-9.]+ documents/s, [0-9.]+ MB/s \(0 skipped, [0-9]+ tokens, 2 workers\) -> $work/out_text_document\.\{bin,idx\}$" \
  "$work/stdout" || fail "summary line"
# A batch holds 512 records here, so the one batch passes 100 at once: one
# plain progress line.
[[ $(grep -c "preprocess_data: 250 documents, .* documents/s" "$work/stderr") == 1 ]] \
  || fail "--log-interval lines"
test -s "$work/out_text_document.bin"
test -s "$work/out_text_document.idx"
echo PASS
