#!/usr/bin/env bash
# Expert parallelism through the train binary (issue 41): a MoE GPT with 8
# experts trained at EP 4 (DP 4) matches the serial run, and its checkpoint
# (expert weights saved as the full [E, ...] tensors, split on dimension 0
# by EP) resumes at EP 1, at EP 2, at EP 2 x PP 2, at TP 2 (experts
# replicated over TP) and at EP 2 x TP 2 with SP (DP 2) within 1e-6 of the
# straight serial run; one saved at EP 2 x TP 2 + SP resumes serially; a
# checkpoint
# saved at EP 2 of DP 4 with the distributed optimizer (expert state sharded
# over the expert-data-parallel group) resumes serially alike, and so does
# one saved at EP 2 of DP 4 under ZeRO-3 (optim_grads_params); EP 2 of DP 4
# in 2 HSDP instances matches the serial run. Layouts not built (EP beside
# TP without SP, ...) are refused by name before any process starts.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=("${tiny_moe_flags[@]}" --moe-layer-freq "[1,1]" --num-experts 8
        --moe-token-dispatcher-type alltoall)

run serial 1
# The replicas checks see experts replicated over expert DP only.
run ep4 4 --expert-model-parallel-size 4 --train-iters 10 --save "$work/ep4" \
  --check-grad-consistency-interval 5 --check-weight-hash-across-dp-replicas-interval 5
compare "$work/serial.jsonl" "$work/ep4.jsonl" 1e-5
echo "ep4 vs serial: $(worst "$work/serial.jsonl" "$work/ep4.jsonl")"
run from_ep4_ep1 1 --load "$work/ep4"
run from_ep4_ep2 2 --load "$work/ep4" --expert-model-parallel-size 2
run from_ep4_ep2_pp2 4 --load "$work/ep4" --expert-model-parallel-size 2 \
  --pipeline-model-parallel-size 2
run from_ep4_tp2 2 --load "$work/ep4" --tensor-model-parallel-size 2
# Megatron's layout beside TP: under SP each TP rank routes its own tokens
# and the EP 2 group spans the TP ranks (ETP 1; TP's ETP would split the
# experts, whose checkpoints are not built).
run from_ep4_ep2_tp2_sp 4 --load "$work/ep4" --expert-model-parallel-size 2 \
  --tensor-model-parallel-size 2 --sequence-parallel \
  --expert-tensor-parallel-size 1
for r in from_ep4_ep1 from_ep4_ep2 from_ep4_ep2_pp2 from_ep4_tp2 \
    from_ep4_ep2_tp2_sp; do
  [[ $(first_iteration "$work/$r.jsonl") == 15 ]] || { echo "$r did not resume"; exit 1; }
  compare "$work/serial.jsonl" "$work/$r.jsonl" 1e-6
  echo "$r vs serial: $(worst "$work/serial.jsonl" "$work/$r.jsonl")"
done

# Saved at EP 2 x TP 2 + SP (TP rank 1 holds the other half of the
# experts), resumed serially.
run ep2_tp2_sp 4 --expert-model-parallel-size 2 --tensor-model-parallel-size 2 \
  --sequence-parallel --expert-tensor-parallel-size 1 --train-iters 10 \
  --save "$work/ep2_tp2_sp"
compare "$work/serial.jsonl" "$work/ep2_tp2_sp.jsonl" 1e-5
run from_ep2_tp2_sp 1 --load "$work/ep2_tp2_sp"
[[ $(first_iteration "$work/from_ep2_tp2_sp.jsonl") == 15 ]] || { echo "from_ep2_tp2_sp did not resume"; exit 1; }
compare "$work/serial.jsonl" "$work/from_ep2_tp2_sp.jsonl" 1e-6
echo "from_ep2_tp2_sp vs serial: $(worst "$work/serial.jsonl" "$work/from_ep2_tp2_sp.jsonl")"

run ep2_distopt 4 --expert-model-parallel-size 2 --use-distributed-optimizer \
  --train-iters 10 --save "$work/ep2_distopt"
run from_ep2_distopt 1 --load "$work/ep2_distopt"
compare "$work/serial.jsonl" "$work/from_ep2_distopt.jsonl" 1e-6
echo "from_ep2_distopt vs serial: $(worst "$work/serial.jsonl" "$work/from_ep2_distopt.jsonl")"

# ZeRO-3 at EP 2 of DP 4: expert weights and state sharded over the
# expert-data-parallel group (2 ranks), the rest over DP 4; resumed serially.
run ep2_zero3 4 --expert-model-parallel-size 2 \
  --data-parallel-sharding-strategy optim_grads_params \
  --train-iters 10 --save "$work/ep2_zero3"
compare "$work/serial.jsonl" "$work/ep2_zero3.jsonl" 1e-5
run from_ep2_zero3 1 --load "$work/ep2_zero3"
compare "$work/serial.jsonl" "$work/from_ep2_zero3.jsonl" 1e-6
echo "from_ep2_zero3 vs serial: $(worst "$work/serial.jsonl" "$work/from_ep2_zero3.jsonl")"
# HSDP: 2 instances of DP 4, the expert-data group of 2 split alike.
# Its checkpoint (expert state gathered over the expert instance) resumes
# serially.
run ep2_hsdp2 4 --expert-model-parallel-size 2 --use-distributed-optimizer \
  --num-distributed-optimizer-instances 2 --train-iters 10 \
  --save "$work/ep2_hsdp2"
compare "$work/serial.jsonl" "$work/ep2_hsdp2.jsonl" 1e-5
echo "ep2_hsdp2 vs serial: $(worst "$work/serial.jsonl" "$work/ep2_hsdp2.jsonl")"
run from_ep2_hsdp2 1 --load "$work/ep2_hsdp2"
compare "$work/serial.jsonl" "$work/from_ep2_hsdp2.jsonl" 1e-6
echo "from_ep2_hsdp2 vs serial: $(worst "$work/serial.jsonl" "$work/from_ep2_hsdp2.jsonl")"

# Not built: refused by name before any process starts.
refused() {
  local name=$1 want=$2
  shift 2
  if "$launch" --nproc_per_node 4 -- "$train" "${common[@]}" "$@" \
      > "$work/$name.log" 2>&1; then
    echo "$name ran"; exit 1
  fi
  grep -q -- "$want" "$work/$name.log" || { cat "$work/$name.log"; exit 1; }
}
refused ep_tp "needs --sequence-parallel" --expert-model-parallel-size 2 \
  --tensor-model-parallel-size 2
refused ep4_hsdp2 "must divide the expert-data-parallel size 1" \
  --expert-model-parallel-size 4 --use-distributed-optimizer \
  --num-distributed-optimizer-instances 2
echo "expert parallelism end to end: parity and resharded resume OK"
