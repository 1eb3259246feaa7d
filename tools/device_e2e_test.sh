#!/usr/bin/env bash
# End to end on a device that is not the host: the test-only builds of train
# and eval (linked with //core/testing:test_device, so --device test puts
# the model, optimizer state, batches and loss on the test device, whose
# memory the host cannot dereference) against the user binaries on the CPU
# with the same flags: the tiny default GPT on the embedded corpus, with
# dropout, serially and over tools/launch at TP 2 + SP, DP 2 with the
# distributed optimizer and PP 2, gives identical loss lines (training,
# validation and test). A checkpoint saved on the test device (DP 2, sharded
# optimizer state) resumes on the CPU with the same next losses, as does
# one saved with --optimizer-cpu-offload at 50%, and eval
# reads it to the same losses on both, serially and at TP 2. The user binaries refuse --device
# test, and --device cuda without a GPU, naming the flag.
set -euo pipefail
abs() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
launch=$(abs "$1")
train_dev=$(abs "$2")
train=$(abs "$3")
eval_dev=$(abs "$4")
eval=$(abs "$5")
source "$6"
work=${TEST_TMPDIR:-$(mktemp -d)}
# The embedded corpus lands under ./runs/default/data.
cd "$work"
common=(--train-iters 8 --lr-decay-iters 8 --log-interval 1 --eval-iters 2
        --eval-interval 4 --num-threads 1 --peak-tflops 1
        --hidden-dropout 0.1 --attention-dropout 0.1)

# go NAME NPROC BINARY FLAGS...: trains, writing NAME.jsonl and NAME.log.
go() {
  local name=$1 nproc=$2 bin=$3
  shift 3
  local cmd=("$bin" "${common[@]}" "$@" --metrics-file "$work/$name.jsonl")
  if [[ $nproc -gt 1 ]]; then
    cmd=("$launch" --nproc_per_node "$nproc" -- "${cmd[@]}")
  fi
  "${cmd[@]}" > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
}

# Every loss the run logs: per iteration, validation and test.
all_losses() {
  losses "$work/$1.jsonl"
  grep -ho '\(validation\|test\) loss[^|]*' "$work/$1.log"
}

# same LAYOUT FLAGS...: the test device's losses are the CPU's, exactly.
same() {
  local layout=$1 nproc=$2
  shift 2
  go "${layout}_cpu" "$nproc" "$train" --device cpu "$@"
  go "${layout}_dev" "$nproc" "$train_dev" --device test "$@"
  grep -q 'device testdev:0 (--device test' "$work/${layout}_dev.log" \
    || { echo "$layout: the test device was not chosen"; cat "$work/${layout}_dev.log"; exit 1; }
  [[ $(losses "$work/${layout}_dev.jsonl" | wc -l) == 8 ]] \
    || { echo "$layout: not 8 loss lines"; exit 1; }
  diff <(all_losses "${layout}_cpu") <(all_losses "${layout}_dev") \
    || { echo "$layout: the test device's losses differ from the CPU's"; exit 1; }
  echo "$layout: test device = CPU ($(all_losses "${layout}_dev" | wc -l) losses)"
}

same serial 1
same tp2_sp 2 --tensor-model-parallel-size 2 --sequence-parallel
same pp2 2 --pipeline-model-parallel-size 2 --micro-batch-size 4 \
  --global-batch-size 16
# Saves at 4 and 8: the sharded optimizer state is gathered on the device.
same dp2_distopt 2 --use-distributed-optimizer --global-batch-size 16 \
  --save "$work/ckpt_dev" --save-interval 4

# The test device's checkpoint at iteration 4, resumed by the user binary on
# the CPU: iterations 5 to 8 as the straight run's.
echo 4 > "$work/ckpt_dev/latest_checkpointed_iteration.txt"
go resumed_cpu 2 "$train" --device cpu --use-distributed-optimizer \
  --global-batch-size 16 --load "$work/ckpt_dev"
[[ "$(first_iteration "$work/resumed_cpu.jsonl")" == 5 ]]
diff <(losses "$work/dp2_distopt_dev.jsonl" | tail -4) \
  <(losses "$work/resumed_cpu.jsonl") \
  || { echo "resumed on the CPU: losses differ"; exit 1; }
echo "checkpoint saved on the test device resumes on the CPU"

# --optimizer-cpu-offload: half the distributed optimizer's state on the
# host (stepped by the CPU kernels), the rest on the test device: the CPU
# run's losses; its checkpoint (state gathered from host and device) resumes
# on the CPU without offloading to the straight run's losses.
go offload_dev 2 "$train_dev" --device test --use-distributed-optimizer \
  --global-batch-size 16 --optimizer-cpu-offload \
  --optimizer-offload-fraction 0.5 --save "$work/ckpt_off" --save-interval 4
grep -q 'optimizer-cpu-offload keeps [1-9][0-9]* of the' "$work/offload_dev.log" \
  || { echo "offload: nothing was kept on the host"; cat "$work/offload_dev.log"; exit 1; }
diff <(all_losses dp2_distopt_cpu) <(all_losses offload_dev) \
  || { echo "offload: losses differ from the CPU's"; exit 1; }
echo 4 > "$work/ckpt_off/latest_checkpointed_iteration.txt"
go offload_resumed 2 "$train" --device cpu --use-distributed-optimizer \
  --global-batch-size 16 --load "$work/ckpt_off"
diff <(losses "$work/dp2_distopt_dev.jsonl" | tail -4) \
  <(losses "$work/offload_resumed.jsonl") \
  || { echo "offload checkpoint resumed on the CPU: losses differ"; exit 1; }
out=$("$train" --device cpu --optimizer-cpu-offload 2>&1) && exit 1
[[ "$out" == *"--optimizer-cpu-offload with --device cpu"*"meaningless"* ]] \
  || { echo "offload on the CPU: '$out'"; exit 1; }
echo "optimizer offload on the test device = CPU, and resumes on the CPU"

# eval: the final checkpoint's losses, on the test device and on the CPU,
# serially and at TP 2.
echo 8 > "$work/ckpt_dev/latest_checkpointed_iteration.txt"
for tp in 1 2; do
  for d in cpu dev; do
    cmd=("$eval" --device cpu)
    if [[ $d == dev ]]; then cmd=("$eval_dev" --device test); fi
    cmd+=(--load "$work/ckpt_dev" --eval-iters 2 --num-threads 1
          --tensor-model-parallel-size "$tp")
    if [[ $tp -gt 1 ]]; then
      cmd=("$launch" --nproc_per_node "$tp" -- "${cmd[@]}")
    fi
    "${cmd[@]}" > "$work/eval_tp${tp}_$d.log" 2>&1 \
      || { cat "$work/eval_tp${tp}_$d.log"; exit 1; }
  done
  grep -q 'device testdev:0' "$work/eval_tp${tp}_dev.log"
  [[ $(grep -c 'loss digits' "$work/eval_tp${tp}_dev.log") == 2 ]]
  diff <(grep -o 'loss digits.*' "$work/eval_tp${tp}_cpu.log") \
    <(grep -o 'loss digits.*' "$work/eval_tp${tp}_dev.log") \
    || { echo "eval TP $tp: the test device's losses differ"; exit 1; }
  echo "eval TP $tp: test device = CPU"
done

# eval --prompt: the inference engine runs on the test device
# (inference/device_step.h; fp32 weights, as the checkpoint's) and continues
# greedily as the CPU engine does.
for d in cpu dev; do
  cmd=("$eval" --device cpu)
  if [[ $d == dev ]]; then cmd=("$eval_dev" --device test); fi
  "${cmd[@]}" --load "$work/ckpt_dev" --eval-iters 2 --num-threads 1 \
    --prompt "Hello, world" --temperature 0 --max-new-tokens 16 \
    > "$work/gen_$d.log" 2>&1 || { cat "$work/gen_$d.log"; exit 1; }
done
grep -q 'device testdev:0' "$work/gen_dev.log" \
  || { cat "$work/gen_dev.log"; echo "generation left the test device"; exit 1; }
grep -q 'continuation: .' "$work/gen_dev.log" \
  || { cat "$work/gen_dev.log"; echo "no continuation on the test device"; exit 1; }
diff <(grep -o 'continuation: .*' "$work/gen_cpu.log") \
  <(grep -o 'continuation: .*' "$work/gen_dev.log") \
  || { echo "eval --prompt: the test device continues differently"; exit 1; }
echo "eval --prompt on the test device = CPU"

# refused BINARY VALUE TEXT: exit 2 and one line naming --device.
refused() {
  local out rc=0
  out=$("$1" --device "$2" 2>&1) || rc=$?
  [[ $rc == 2 && "$out" == *"$3"* ]] \
    || { echo "$1 --device $2: rc $rc, '$out'"; exit 1; }
}
refused "$train" test "--device: 'test' is not one of cpu, cuda or auto"
refused "$eval" test "--device: 'test' is not one of cpu, cuda or auto"
if [[ ! -e /dev/nvidia0 ]]; then
  refused "$train" cuda "--device cuda: no CUDA device is present"
  refused "$eval" cuda "--device cuda: no CUDA device is present"
  # auto falls back to the CPU and says why.
  go auto 1 "$train" --train-iters 1 --eval-iters 0
  grep -q 'device cpu (--device auto: no CUDA device present)' "$work/auto.log"
fi
echo "device end-to-end: OK"
