#!/usr/bin/env bash
# A Hugging Face LlamaForCausalLM checkpoint written by a plain PyTorch
# reference of its forward pass (tools/llama_reference.py, float64, under
# Debian's /usr/bin/python3 with python3-torch) is imported by
# convert_checkpoint; eval on the import gives the reference's next-token
# loss on a fixed token sequence within 1e-4 relative (fp32 against float64:
# the error is ~1e-6) and the reference's greedy tokens, at TP 1 and TP 2
# (whose vocabulary padding must take no probability). The import trains
# at another sequence length under TP 2 x PP 2 with the serial run's losses
# (1e-5), and exporting it gives back the reference's tensors bit for bit,
# sharded or not. An optional sixth argument names the family the reference
# writes (llama, llama31: rope_scaling of type llama3; qwen2: q/k/v biases,
# tied embeddings; qwen3: QK-norm; mixtral: every layer 4 experts, top-2;
# qwen2_moe: q/k/v biases, layer 1 4 experts top-2 not renormalised plus a
# gated shared expert, layer 0 dense; mistral: a sliding window of 6 keys
# over 22 positions) and so the training flags.
set -euo pipefail
launch=$1
train=$2
eval=$3
convert=$4
reference=$5
family=${6:-llama}
case $family in
  llama) family_flags=(--untie-embeddings-and-output-weights); model_type=llama ;;
  llama31) family_flags=(--untie-embeddings-and-output-weights --use-rope-scaling
             --rope-scaling-factor 8 --rope-scaling-low-freq-factor 1
             --rope-scaling-high-freq-factor 4
             --rope-scaling-original-max-position-embeddings 64); model_type=llama ;;
  qwen2) family_flags=(--add-qkv-bias); model_type=qwen2 ;;
  qwen3) family_flags=(--untie-embeddings-and-output-weights --qk-layernorm); model_type=qwen3 ;;
  mixtral) family_flags=(--untie-embeddings-and-output-weights --num-experts 4
             --moe-router-topk 2 --moe-ffn-hidden-size 48); model_type=mixtral ;;
  qwen2_moe) family_flags=(--untie-embeddings-and-output-weights --add-qkv-bias
               --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32
               --moe-layer-freq "[0,1]" --moe-shared-expert-intermediate-size 48
               --moe-shared-expert-gate --moe-router-pre-softmax); model_type=qwen2_moe ;;
  mistral) family_flags=(--untie-embeddings-and-output-weights --window-size 5,0); model_type=mistral ;;
  *) echo "unknown family $family"; exit 1 ;;
esac
# Mixtral: the experts' and the config's intermediate size (its MoE layers
# are replicated over TP, without SP).
ffn=176
[[ $family == mixtral ]] && ffn=48
[[ $family == qwen2_moe ]] && ffn=96
work=${TEST_TMPDIR:-$(mktemp -d)}
python=/usr/bin/python3
if ! "$python" -c "import torch" > /dev/null 2>&1; then
  echo "SKIPPED: $python cannot import torch (apt-get install python3-torch);"
  echo "the PyTorch reference of LlamaForCausalLM did not run."
  exit 0
fi

prompt="3 17 42 5 88 1 60 23 9 71 14 2"
new=10
"$python" "$reference" write "$work/hf" --prompt-ids "$prompt" --new $new \
  --family "$family" > "$work/ref.json"
cat "$work/ref.json"
read -r ref_loss ref_tokens margin < <("$python" -c '
import json, sys
r = json.load(open(sys.argv[1]))
print(repr(r["loss"]), ",".join(map(str, r["greedy"])), r["margin"])' "$work/ref.json")
# Ties between the two best logits would make greedy decoding ill-posed
# (seed 2: the smallest margin is ~0.1, fp32 errors ~1e-5).
awk -v m="$margin" 'BEGIN { if (!(m > 1e-2)) { print "reference margin " m " too small"; exit 1 } }'

"$convert" --import-hf "$work/hf" --save "$work/ckpt"

check_eval() {  # name nproc flags...
  local name=$1 nproc=$2
  shift 2
  local cmd=("$eval" --load "$work/ckpt" --prompt-ids "$prompt" --output-ids
             --temperature 0 --max-new-tokens $new --num-threads 1 "$@")
  if [[ $nproc == 1 ]]; then
    "${cmd[@]}" > "$work/$name.out" 2> "$work/$name.log" || { cat "$work/$name.log"; exit 1; }
  else
    # The launcher prefixes each line with its rank; only rank 0 prints.
    "$launch" --nproc_per_node "$nproc" -- "${cmd[@]}" > "$work/$name.raw" 2> "$work/$name.log" \
      || { cat "$work/$name.raw" "$work/$name.log"; exit 1; }
    sed 's/^\[rank 0\] //' "$work/$name.raw" > "$work/$name.out"
  fi
  local loss tokens
  loss=$(sed -n 's/^prompt loss: \([^ ]*\) over 11 next-token predictions$/\1/p' "$work/$name.out")
  tokens=$(grep -v '^prompt loss' "$work/$name.out" | tr ' ' ',')
  echo "$name: loss $loss (reference $ref_loss), tokens $tokens (reference $ref_tokens)"
  awk -v a="$loss" -v b="$ref_loss" 'BEGIN { d = a - b; if (d < 0) d = -d;
    if (a == "" || d > 1e-4 * b) { print "loss " a " vs reference " b; exit 1 } }'
  [[ "$tokens" == "$ref_tokens" ]] || { echo "greedy tokens differ"; exit 1; }
}
check_eval tp1 1
check_eval tp2 2 --tensor-model-parallel-size 2

# The import trains under any layout: its flags are the config.json's, but
# for the sequence length (64 positions there; rotary positions have no
# table, so any length loads).
flags=(--num-layers 2 --hidden-size 64 --num-attention-heads 4
       --group-query-attention --num-query-groups 2 --ffn-hidden-size "$ffn"
       --seq-length 32 --position-embedding-type rope
       --rotary-base 50000 --normalization RMSNorm --norm-epsilon 1e-6 --swiglu
       "${family_flags[@]}" --disable-bias-linear
       --mock-data --vocab-size 96 --micro-batch-size 2 --global-batch-size 4
       --train-iters 3 --lr-decay-iters 3 --eval-iters 0 --log-interval 1
       --num-threads 1 --load "$work/ckpt" --no-load-optim)
losses() { sed -n 's/.*"iteration": \([0-9]*\),.*"loss": \([^,]*\),.*/\1 \2/p' "$1"; }
"$train" "${flags[@]}" --metrics-file "$work/serial.jsonl" > "$work/serial.log" 2>&1 \
  || { cat "$work/serial.log"; exit 1; }
grep -q "loaded .*iter_0000000" "$work/serial.log"
"$launch" --nproc_per_node 4 -- "$train" "${flags[@]}" --tensor-model-parallel-size 2 \
  --pipeline-model-parallel-size 2 --metrics-file "$work/tp2pp2.jsonl" > "$work/tp2pp2.log" 2>&1 \
  || { cat "$work/tp2pp2.log"; exit 1; }
paste <(losses "$work/serial.jsonl") <(losses "$work/tp2pp2.jsonl") | awk '
  { d = $2 - $4; if (d < 0) d = -d; n++; if ($1 != $3 || d > 1e-5 * $2) { print "differs: " $0; bad = 1 } }
  END { if (n != 3 || bad) { print n " iterations compared"; exit 1 } }'

# Export of the import: the reference's tensors, bit for bit.
"$convert" --load "$work/ckpt" --export-hf "$work/out_single"
test -f "$work/out_single/model.safetensors"
grep -q "\"model_type\": \"$model_type\"" "$work/out_single/config.json"
grep -q '"num_key_value_heads": 2' "$work/out_single/config.json"
"$python" "$reference" same "$work/hf" "$work/out_single"
"$convert" --load "$work/ckpt" --export-hf "$work/out_sharded" --max-shard-size 100KB
test -f "$work/out_sharded/model.safetensors.index.json"
test ! -e "$work/out_sharded/model.safetensors"
"$python" "$reference" same "$work/hf" "$work/out_sharded"
echo "$family: PyTorch reference loss and greedy tokens, training and export OK"
