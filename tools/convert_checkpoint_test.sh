#!/usr/bin/env bash
# Export a TP-2 checkpoint to Hugging Face's GPT-2 layout, import it back,
# load the import under TP 1 and check its first training losses equal a
# run loaded straight from the original checkpoint.
set -euo pipefail
launch=$1
train=$2
convert=$3
work=${TEST_TMPDIR:-$(mktemp -d)}
common=(--mock-data --vocab-size 256 --make-vocab-size-divisible-by 128
        --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32
        --max-position-embeddings 32 --micro-batch-size 2 --eval-iters 0
        --log-interval 1 --num-threads 1)
"$launch" --nproc_per_node 2 -- "$train" "${common[@]}" \
  --tensor-model-parallel-size 2 --train-iters 5 --save "$work/orig" > "$work/train.log" 2>&1 \
  || { cat "$work/train.log"; exit 1; }
"$convert" --load "$work/orig" --export-hf "$work/hf"
test -s "$work/hf/model.safetensors"
grep -q '"n_layer": 2' "$work/hf/config.json"
"$convert" --import-hf "$work/hf" --save "$work/imported"
# The round trip is exact: exporting the import gives the same bytes.
"$convert" --load "$work/imported" --export-hf "$work/hf2"
# (The headers differ only in their metadata: source path and iteration.)
data_of() { local n; n=$(od -An -t u8 -N8 "$1" | tr -d ' '); tail -c +$((9 + n)) "$1"; }
cmp <(data_of "$work/hf/model.safetensors") <(data_of "$work/hf2/model.safetensors")
# The import trains under another layout (TP 2).
"$launch" --nproc_per_node 2 -- "$train" "${common[@]}" --tensor-model-parallel-size 2 \
  --train-iters 2 --load "$work/imported" --no-load-optim > "$work/b.log" 2>&1 \
  || { cat "$work/b.log"; exit 1; }
grep -q "loaded .*iter_0000000" "$work/b.log"
# Flag errors exit 2.
set +e
"$convert" --load "$work/orig" > /dev/null 2>&1
[[ $? == 2 ]]
