#!/usr/bin/env bash
# Mixture-of-experts checkpoints through convert_checkpoint (issue 41): a
# Mixtral-shaped model (every layer MoE), a Qwen3-MoE-shaped one (QK-norm,
# a dense first layer: mlp_only_layers) and a Qwen2-MoE-shaped one (q/k/v
# biases, a dense first layer, a gated shared expert, top-k weights not
# renormalised) trained by train export as MixtralForCausalLM /
# Qwen3MoeForCausalLM / Qwen2MoeForCausalLM, import back, export again to
# the same tensor bytes, and the import resumes training. A qwen2_moe config
# without its shared expert's size is refused, naming the key.
set -euo pipefail
train=$1
convert=$2
work=${TEST_TMPDIR:-$(mktemp -d)}
common=(--num-layers 2 --hidden-size 32 --num-attention-heads 4
        --group-query-attention --num-query-groups 2 --seq-length 16
        --position-embedding-type rope --normalization RMSNorm --swiglu
        --untie-embeddings-and-output-weights --disable-bias-linear
        --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 24
        --mock-data --vocab-size 64 --micro-batch-size 2 --num-threads 1
        --eval-iters 0 --log-interval 1)
data_of() { local n; n=$(od -An -t u8 -N8 "$1" | tr -d ' '); tail -c +$((9 + n)) "$1"; }
for family in mixtral qwen3_moe qwen2_moe; do
  case $family in
    mixtral) flags=(--ffn-hidden-size 24); arch=MixtralForCausalLM ;;
    qwen3_moe) flags=(--ffn-hidden-size 40 --qk-layernorm --moe-layer-freq "[0,1]")
               arch=Qwen3MoeForCausalLM ;;
    qwen2_moe) flags=(--ffn-hidden-size 40 --add-qkv-bias --moe-layer-freq "[0,1]"
                      --moe-shared-expert-intermediate-size 20 --moe-shared-expert-gate
                      --moe-router-pre-softmax)
               arch=Qwen2MoeForCausalLM ;;
  esac
  "$train" "${common[@]}" "${flags[@]}" --train-iters 2 --save "$work/$family" \
    > "$work/$family.log" 2>&1 || { cat "$work/$family.log"; exit 1; }
  "$convert" --load "$work/$family" --export-hf "$work/${family}_hf" > /dev/null
  grep -q "\"architectures\": \[" "$work/${family}_hf/config.json"
  grep -q "\"$arch\"" "$work/${family}_hf/config.json" \
    || { cat "$work/${family}_hf/config.json"; exit 1; }
  "$convert" --import-hf "$work/${family}_hf" --save "$work/${family}_imported" > /dev/null
  "$convert" --load "$work/${family}_imported" --export-hf "$work/${family}_hf2" > /dev/null
  cmp <(data_of "$work/${family}_hf/model.safetensors") \
      <(data_of "$work/${family}_hf2/model.safetensors")
  "$train" "${common[@]}" "${flags[@]}" --train-iters 1 --load "$work/${family}_imported" \
    --no-load-optim > "$work/${family}_resumed.log" 2>&1 \
    || { cat "$work/${family}_resumed.log"; exit 1; }
  grep -q "loaded .*iter_0000000" "$work/${family}_resumed.log"
done
grep -q '"mlp_only_layers": \[' "$work/qwen3_moe_hf/config.json"
grep -q '"model.layers.1.block_sparse_moe.experts.3.w2.weight"' \
  "$work/mixtral_hf/model.safetensors"
grep -q '"norm_topk_prob": false' "$work/qwen2_moe_hf/config.json"
grep -q '"shared_expert_intermediate_size": 20' "$work/qwen2_moe_hf/config.json"
grep -q '"model.layers.1.mlp.shared_expert_gate.weight"' \
  "$work/qwen2_moe_hf/model.safetensors"

mkdir -p "$work/qwen2_moe_bad"
grep -v '"shared_expert_intermediate_size"' "$work/qwen2_moe_hf/config.json" \
  > "$work/qwen2_moe_bad/config.json"
cp "$work/qwen2_moe_hf/model.safetensors" "$work/qwen2_moe_bad/"
if "$convert" --import-hf "$work/qwen2_moe_bad" --save "$work/never" > "$work/qwen2_moe_bad.log" 2>&1; then
  echo "qwen2_moe without shared_expert_intermediate_size was imported"; exit 1
fi
grep -q "shared_expert_intermediate_size" "$work/qwen2_moe_bad.log" \
  || { cat "$work/qwen2_moe_bad.log"; exit 1; }
test ! -e "$work/never"
echo "MoE Hugging Face export, import and round trip OK"
