#!/usr/bin/env bash
# Everything the GPU machine is asked, in one call without Bazel, ordered by
# what a result tells and under one time budget, every result written to an
# output folder as it comes (so a call that times out still returns what
# finished):
#   preflight        tools/gpu/preflight.sh: GPU, driver, every library's
#                    resolved file; stops the run early when one is missing
#                    or an expected GPU is not visible
#   kernels          the CUDA kernel and runtime tests (gtest binaries)
#   parity_fp32      train on the GPU against the CPU, fp32 (TF32 off)
#   moe              mixture of experts: a tiny MoE GPT (8 experts, top-2,
#                    shared expert, aux and z-loss, expert bias) trained on
#                    the GPU against the CPU, fp32, 5 steps; and the grouped
#                    GEMM's TFLOP/s against a dense cuBLASLt GEMM of equal
#                    FLOPs (core/ops/cuda/grouped_gemm_bench; reported, the
#                    issue's 85% is not enforced). About 30 s.
#   parity_gpt2      the same for GPT-2 124M at sequence 1024, 3 steps
#   parity_offload   --optimizer-cpu-offload at 50% against the CPU, 10 steps
#   gpt2_throughput  GPT-2 124M tokens/s, MFU, peak memory
#   pytorch_peer     the same model in the machine's PyTorch (eager and
#                    torch.compile; tools/gpu/torch_gpt2_peer.py), tokens/s
#                    beside train's
#   bench            the CUDA kernel bench (GEMM peak on the GPU)
#   parity_bf16      as parity_fp32 in bf16
#   cuda_graph       --cuda-graph against eager
#   offload          activation offloading
#   nccl             NCCL process groups; with two GPUs or more the TP, PP
#                    and DP layouts against one GPU
#   multi_rank       the parallel layouts on several GPUs
#   serve_8b         serve with a Llama-3-8B-shaped random model against
#                    transformers' generate (tools/gpu/check_serve.sh):
#                    tokens/s, TTFT and p99 inter-token latency at 1, 16 and
#                    64 clients
#
#   tools/gpu/run_checks.sh [--out DIR] [--expect-gpu|--no-expect-gpu] [--full-bench] [BUNDLE]
#
# BUNDLE: a folder made by tools/gpu/make_bundle.sh (BUNDLE/bin, BUNDLE/lib,
# BUNDLE/data; default gpu_bundle); BUNDLE.tar.xz is unpacked beside itself
# when BUNDLE is absent. Libraries: check_lib.sh's gpu_library_path.
#
# Output folder: --out DIR, else $OUT where the environment sets one (the
# device tool does), else BUNDLE/out. It receives, as the run goes:
#   run.log      everything printed
#   summary.tsv  one line per section as it ends: section, state (ok,
#                failed, timeout, skipped, not-run, not-chosen), seconds, detail
#   logs.tgz     every log (BUNDLE/logs), rewritten after each section and
#                on exit, also when the run is killed with TERM or INT
# The last line printed (and the last of run.log) is the summary:
#   GPU CHECKS: ok (preflight ok, kernels ok, ...; 312 s of 420)
#   GPU CHECKS: FAILED (kernels failed, ...; failing: core/ops/cuda/gemm_test(rc=1))
#
# No false green: when a GPU is expected (--expect-gpu, or nvidia-smi lists
# one; --no-expect-gpu for a rehearsal without one), MCC_EXPECT_CUDA=1 makes
# any binary that sees no CUDA device die saying why, a skipped GPU test is
# a failure and a section that skips is a failure. Without one (CI's
# rehearsal, tools/gpu/run_checks_test.sh) tests skip, saying so.
#
# --sections a,b,...: run only those sections (preflight always runs; the
# others are recorded not-chosen, which is not a failure), in the script's
# order. The sections: kernels parity_fp32 moe_parity moe_gemm parity_gpt2
# parity_offload gpt2_throughput pytorch_peer bench parity_bf16 cuda_graph
# offload nccl multi_rank serve_8b. Their default budgets add up to more
# than the run's, so one call on the device picks what it needs most.
#
# Time: RUN_CHECKS_BUDGET (default 420 s) for the whole run, so that a rerun
# fits the device tool's 15 minutes; each section has its own budget
# (SECTION_BUDGET_<name>, defaults below) cut to what the whole run has
# left, and each test binary TEST_TIMEOUT (default 60 s) cut to its
# section's; every one runs under timeout -k, so a hung test is killed and
# the rest still run. A failing kernel test is rerun once with
# CUDA_LAUNCH_BLOCKING=1, then under compute-sanitizer memcheck where the
# machine has it (both capped at TEST_TIMEOUT; logs only).
#
# GPU_CHECK_TESTS, GPU_CHECK_OFFLOAD_TESTS and GPU_CHECK_NCCL_TESTS
# (space-separated, relative to BUNDLE/bin) replace those sections' tests; tools/gpu/check_lib.sh lists the variables the train
# checks share (GPU_CHECK_DEVICE=test with //tools:train_testdev as train
# rehearses them without a GPU).
set -uo pipefail
scripts="$(cd "$(dirname "$0")" && pwd)"

dir="gpu_bundle"
out="${OUT:-}"
full_bench=0
expect_gpu=""
sections=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift ;;
    --out=*) out="${1#--out=}" ;;
    --full-bench) full_bench=1 ;;
    --quick) ;;  # The default now; kept for old command lines.
    --expect-gpu) expect_gpu=1 ;;
    --sections) sections="$2"; shift ;;
    --sections=*) sections="${1#--sections=}" ;;
    --no-expect-gpu) expect_gpu=0 ;;
    *) dir="$1" ;;
  esac
  shift
done
# A bundle carried packed: unpacked beside its tarball first.
if [[ ! -d "${dir}" && -f "${dir}.tar.xz" ]]; then
  tar -xJf "${dir}.tar.xz" -C "$(dirname "${dir}")" || exit 1
fi
out="${out:-${dir}/out}"
mkdir -p "${out}" || exit 1
out="$(cd "${out}" && pwd)"
# Everything printed also lands in run.log, line by line.
# tee ignores TERM and INT, so that what the run says while it is being
# stopped still reaches run.log.
exec > >(trap '' TERM INT; exec tee -a "${out}/run.log") 2>&1
tee_pid=$!

source "${scripts}/check_lib.sh"
bundle_paths "${dir}"
if [[ -z "${expect_gpu}" ]]; then
  expect_gpu=0
  command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU ' &&
    expect_gpu=1
fi
if ((expect_gpu)); then
  export MCC_EXPECT_CUDA=1
else
  unset MCC_EXPECT_CUDA
fi

budget="${RUN_CHECKS_BUDGET:-420}"
run_deadline=$(($(date +%s) + budget))
test_timeout="${TEST_TIMEOUT:-60}"

pack_logs() {
  # Without the train runs' index caches (rebuilt from the data).
  tar -czf "${out}/logs.tgz.part" --exclude='*_cache' -C "${dir}" logs 2>/dev/null &&
    mv -f "${out}/logs.tgz.part" "${out}/logs.tgz"
}
# The command running now (started in the background and waited for, so
# that a signal reaches on_signal at once: bash runs traps only between
# foreground commands).
child=""
on_signal() {
  trap '' PIPE
  # Each command runs under timeout, which leads a process group of its
  # own: stop all of it.
  [[ -n "${child}" ]] && kill -TERM -- -"${child}" 2>/dev/null
  printf '%s\t%s\t%s\t%s\n' run killed "${SECONDS}" "$1" >>"${out}/summary.tsv"
  pack_logs
  echo "run_checks: killed by $1 after ${SECONDS} s; results so far are in ${out}"
  [[ -n "${child}" ]] && sleep 1 && kill -KILL -- -"${child}" 2>/dev/null
  exit 1
}
# run_waited CMD...: runs CMD in the background and waits for it; its
# exit status.
run_waited() {
  "$@" &
  child=$!
  wait "${child}"
  local rc=$?
  child=""
  return "${rc}"
}
# run_logged LOG CMD...: run_waited, the output to LOG and, as it comes, to
# this run's output.
run_logged() {
  local log="$1" rc tailer
  shift
  : >"${log}"
  tail -n +1 -f "${log}" &
  tailer=$!
  run_waited "$@" >>"${log}" 2>&1
  rc=$?
  sleep 0.2
  kill "${tailer}" 2>/dev/null
  wait "${tailer}" 2>/dev/null
  return "${rc}"
}
# On exit: the logs packed, and run.log complete before the call returns.
finish() {
  pack_logs
  exec >&- 2>&-
  # tee ends at end of input; after a signal bash may still hold copies of
  # the pipe (saved around a redirection), so wait at most 2 s.
  local i
  for i in $(seq 20); do
    kill -0 "${tee_pid}" 2>/dev/null || break
    sleep 0.1
  done
}
trap finish EXIT
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
[[ -f "${out}/summary.tsv" ]] ||
  printf 'section\tstate\tseconds\tdetail\n' >"${out}/summary.tsv"

states=()
failures=()
# record NAME STATE SECONDS DETAIL: a section's line, written at once.
record() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"${out}/summary.tsv"
  states+=("$1 $2")
  echo "== $1: $2 ($3 s) $4"
  pack_logs
}
# section_seconds NAME DEFAULT: the section's budget cut to the run's.
section_seconds() {
  local var="SECTION_BUDGET_$1" want left
  want="${!var:-$2}"
  left=$((run_deadline - $(date +%s)))
  ((left < want)) && want="${left}"
  ((want < 0)) && want=0
  echo "${want}"
}
# unchosen NAME: true (and the section recorded "not-chosen", not a
# failure) when --sections names others only.
unchosen() {
  [[ -z "${sections}" || ",${sections}," == *",$1,"* ]] && return 1
  record "$1" not-chosen 0 "not in --sections"
  return 0
}
# capped SECONDS DEADLINE: SECONDS cut to DEADLINE (epoch seconds).
capped() {
  local left=$(($2 - $(date +%s)))
  ((left < $1)) && echo "${left}" || echo "$1"
}

echo "run_checks: bundle ${dir}, output ${out}, GPU expected: $([[ ${expect_gpu} == 1 ]] && echo yes || echo no)," \
  "budget ${budget} s, ${test_timeout} s a test"

# --- preflight: stops the run when the bundle cannot start here.
start=${SECONDS}
preflight_args=()
((expect_gpu)) && preflight_args+=(--expect-gpu)
run_logged "${logs}/preflight.log" timeout -k 2 "$(section_seconds preflight 20)" \
  "${scripts}/preflight.sh" "${preflight_args[@]}" "${dir}"
line="$(tail -1 "${logs}/preflight.log")"
if [[ "${line}" == "PREFLIGHT: ok"* ]]; then
  record preflight ok $((SECONDS - start)) "${line#PREFLIGHT: ok }"
else
  record preflight failed $((SECONDS - start)) "${line:-no answer}"
  echo "GPU CHECKS: FAILED (preflight: ${line:-no answer}; nothing else run)"
  exit 1
fi

# --- kernels and offload: gtest binaries, one line each.
# run_tests SECTION DEFAULT_BUDGET TEST...: each under timeout -k, a failing
# one rerun for diagnosis; records the section.
run_tests() {
  local name="$1" section_deadline t exe log rc n_skip passed=0 bad=0 detail=()
  unchosen "${name}" && return
  section_deadline=$(($(date +%s) + $(section_seconds "$1" "$2")))
  shift 2
  local start=${SECONDS}
  for t in "$@"; do
    exe="${bin}/${t}"
    log="${logs}/$(basename "${t}").log"
    local limit
    limit="$(capped "${test_timeout}" "${section_deadline}")"
    if [[ ! -x "${exe}" ]]; then
      echo "MISSING ${t}"
      bad=$((bad + 1)); failures+=("${t}(missing)"); continue
    fi
    if ((limit < 2)); then
      echo "NOT RUN ${t}: the ${name} section's budget is spent"
      bad=$((bad + 1)); failures+=("${t}(not run)"); continue
    fi
    run_waited timeout -k 5 "${limit}" "${exe}" >"${log}" 2>&1
    rc=$?
    n_skip=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "${log}")
    # Skips for want of a device ("no CUDA device ..." under gtest's
    # "Skipped"), as against by design (two GPUs needed, the no-device
    # tests on a GPU machine).
    n_nodev=$(awk '/: Skipped$/ { s = 1; next } s { if (/no CUDA device/) n++; s = 0 }
      END { print n + 0 }' "${log}")
    if [[ ${rc} -eq 124 || ${rc} -eq 137 ]]; then
      echo "TIMEOUT ${t} after ${limit} s (log $(basename "${log}"))"
      bad=$((bad + 1)); failures+=("${t}(timeout ${limit}s)")
    elif [[ ${rc} -ne 0 ]]; then
      echo "FAIL ${t} rc=${rc} (log $(basename "${log}")):"
      grep -E '^\[  FAILED  \]|Failure|Check failed|MCC_EXPECT_CUDA|error' "${log}" | head -10 | sed 's/^/    /'
      bad=$((bad + 1)); failures+=("${t}(rc=${rc})")
      diagnose "${t}" "${section_deadline}"
    elif ((expect_gpu && n_nodev > 0)); then
      # A GPU is there and the test did not see it: nothing was checked.
      echo "FAIL ${t}: ${n_nodev} tests skipped for want of a CUDA device although a GPU is expected"
      grep -m2 'no CUDA device' "${log}" | sed 's/^/    /'
      bad=$((bad + 1)); failures+=("${t}(${n_nodev} skipped: no CUDA device)")
    else
      echo "PASS ${t} (${n_skip} skipped)"
      passed=$((passed + 1))
    fi
  done
  local state=ok
  ((bad)) && state=failed
  record "${name}" "${state}" $((SECONDS - start)) "${passed} passed, ${bad} failed"
}
# diagnose TEST DEADLINE: reruns a failed test with CUDA_LAUNCH_BLOCKING=1,
# then under compute-sanitizer memcheck, for their logs.
diagnose() {
  local exe="${bin}/$1" base limit sanitizer
  base="${logs}/$(basename "$1")"
  limit="$(capped "${test_timeout}" "$2")"
  ((limit < 2)) && return
  CUDA_LAUNCH_BLOCKING=1 run_waited timeout -k 5 "${limit}" "${exe}" >"${base}.blocking.log" 2>&1
  echo "    rerun with CUDA_LAUNCH_BLOCKING=1: rc=$? (log $(basename "${base}").blocking.log)"
  sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  limit="$(capped "${test_timeout}" "$2")"
  if [[ -x "${sanitizer}" ]] && ((limit >= 2)); then
    run_waited timeout -k 5 "${limit}" "${sanitizer}" --tool memcheck \
      --error-exitcode 99 "${exe}" >"${base}.memcheck.log" 2>&1
    echo "    compute-sanitizer memcheck: rc=$? (log $(basename "${base}").memcheck.log)"
  fi
}

if [[ -n "${GPU_CHECK_TESTS:-}" ]]; then
  read -r -a kernel_tests <<<"${GPU_CHECK_TESTS}"
else
  mapfile -t kernel_tests < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' \
    "$(dirname "${BASH_SOURCE[0]}")/kernel_tests.txt")
fi
run_tests kernels 150 "${kernel_tests[@]}"

# --- train checks: each prints "PREFIX: ok|skipped|FAILED ..." last.
# train_section NAME DEFAULT_BUDGET SCRIPT PREFIX [VAR=VALUE...]
train_section() {
  local name="$1" seconds script="${scripts}/$3" prefix="$4" line state rc
  unchosen "${name}" && return
  seconds="$(section_seconds "$1" "$2")"
  shift 4
  local start=${SECONDS}
  if ((seconds < 10)); then
    record "${name}" not-run 0 "the run's budget is spent"
    failures+=("${name}(not run)")
    return
  fi
  run_logged "${logs}/${name}.log" env "$@" \
    GPU_CHECK_DEADLINE=$(($(date +%s) + seconds)) \
    STEP_TIMEOUT="${STEP_TIMEOUT:-${seconds}}" THROUGHPUT_BUDGET="${seconds}" \
    timeout -k 5 $((seconds + 10)) "${script}" "${dir}"
  rc=$?
  line="$(tail -1 "${logs}/${name}.log")"
  case "${line}" in
    "${prefix}: ok"*) state=ok ;;
    "${prefix}: skipped"*) state=skipped ;;
    *) state=failed ;;
  esac
  ((rc == 124 || rc == 137)) && state=timeout
  # Where a GPU is expected a skip checked nothing: it fails.
  if [[ ${state} == skipped ]] && ((expect_gpu)) && [[ "${line}" != *"1 GPU"* ]]; then
    state=failed
  fi
  [[ ${state} == ok || ${state} == skipped ]] || failures+=("${name}(${state})")
  record "${name}" "${state}" $((SECONDS - start)) "${line#"${prefix}: "}"
}

train_section parity_fp32 60 check_train_parity.sh "TRAIN PARITY" PARITY_PRECISIONS=fp32
# --- moe: MoE parity (the train check with an MoE model) and the grouped
# GEMM's rate against dense.
train_section moe_parity 25 check_train_parity.sh "TRAIN PARITY" PARITY_PRECISIONS=fp32 \
  PARITY_STEPS="${MOE_PARITY_STEPS:-5}" PARITY_NAME=moe_parity \
  PARITY_MODEL_FLAGS="--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 64 --moe-shared-expert-intermediate-size 64 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-router-enable-expert-bias --disable-bias-linear"
moe_gemm_section() {
  local seconds start=${SECONDS} exe="${bin}/core/ops/cuda/grouped_gemm_bench" rc state line
  unchosen moe_gemm && return
  seconds="$(section_seconds moe_gemm 15)"
  if ((seconds < 2)); then
    record moe_gemm not-run 0 "the run's budget is spent"
    failures+=("moe_gemm(not run)")
    return
  fi
  if [[ ! -x "${exe}" ]]; then
    record moe_gemm failed 0 "missing ${exe}"; failures+=("moe_gemm(missing)"); return
  fi
  run_logged "${logs}/moe_gemm.log" timeout -k 5 "$((seconds > 1 ? seconds : 1))" \
    "${exe}" --iters=10
  rc=$?
  case ${rc} in
    0) state=ok ;;
    124 | 137) state=timeout ;;
    *) state=failed ;;
  esac
  if grep -q 'no CUDA device' "${logs}/moe_gemm.log"; then
    state=skipped
    ((expect_gpu)) && state=failed
  fi
  line="$(grep -m1 '^GROUPED GEMM:' "${logs}/moe_gemm.log")"
  [[ ${state} == ok || ${state} == skipped ]] || failures+=("moe_gemm(${state})")
  record moe_gemm "${state}" $((SECONDS - start)) "${line:-rc=${rc}}"
}
moe_gemm_section

# GPT-2 124M at full size: 3 steps of 2 sequences of 1024, fp32 (TF32 off),
# the GPU against the CPU within 1e-4.
train_section parity_gpt2 60 check_train_parity.sh "TRAIN PARITY" PARITY_PRECISIONS=fp32 \
  PARITY_STEPS="${PARITY_GPT2_STEPS:-3}" PARITY_NAME=parity_gpt2 \
  PARITY_MODEL_FLAGS="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --vocab-size 50304 --micro-batch-size 1 --global-batch-size 2"
# --optimizer-cpu-offload: half the optimizer's elements stepped on the host
# by the CPU kernels, the rest on the GPU, 10 steps within 1e-4 of the CPU.
train_section parity_offload 30 check_train_parity.sh "TRAIN PARITY" PARITY_PRECISIONS=fp32 \
  PARITY_STEPS=10 PARITY_NAME=parity_offload \
  GPU_CHECK_CANDIDATE_FLAGS="--optimizer-cpu-offload --optimizer-offload-fraction 0.5"
train_section gpt2_throughput 75 check_gpt2_throughput.sh "GPT2 THROUGHPUT"

# --- the PyTorch peer: the same GPT-2 124M and micro-batch in the machine's
# own PyTorch (tools/gpu/torch_gpt2_peer.py), eager and torch.compile, and
# train's tokens/s over the fastest of them.
peer_section() {
  local seconds start=${SECONDS} python mbs ours line state rc best ratio=""
  unchosen pytorch_peer && return
  seconds="$(section_seconds pytorch_peer 80)"
  python="${GPU_CHECK_PYTHON:-/opt/torch/.venv/bin/python3}"
  [[ -x "${python}" ]] || python="$(command -v python3)"
  read -r mbs ours < <(sed -n 's/^GPT2 THROUGHPUT: ok (micro-batch \([0-9]*\): \([0-9]*\) tokens\/s.*/\1 \2/p' \
    "${logs}/gpt2_throughput.log" 2>/dev/null)
  if [[ -z "${python}" ]] || ((seconds < 20)); then
    state=skipped
    ((expect_gpu)) && state=failed
    [[ ${state} == failed ]] && failures+=("pytorch_peer(not run)")
    record pytorch_peer "${state}" 0 "${python:+no time left}${python:-no python3}"
    return
  fi
  # Its own libraries: not the bundle's (an older libstdc++ among them).
  read -r -a peer_args <<<"${PEER_ARGS:-}"
  run_logged "${logs}/pytorch_peer.log" env -u LD_LIBRARY_PATH -u MCC_EXPECT_CUDA \
    PYTHONUNBUFFERED=1 timeout -k 5 "${seconds}" "${python}" \
    "${scripts}/torch_gpt2_peer.py" --micro-batch "${mbs:-16}" \
    --budget $((seconds - 15)) "${peer_args[@]}"
  rc=$?
  line="$(tail -1 "${logs}/pytorch_peer.log")"
  case "${line}" in
    "PYTORCH PEER: ok"*) state=ok ;;
    "PYTORCH PEER: skipped"*) state=skipped ;;
    *) state=failed ;;
  esac
  ((rc == 124 || rc == 137)) && state=timeout
  [[ ${state} == skipped ]] && ((expect_gpu)) && state=failed
  [[ ${state} == ok || ${state} == skipped ]] || failures+=("pytorch_peer(${state})")
  best="$(grep -oE '^PYTORCH (eager|compile): [0-9]+ tokens/s' "${logs}/pytorch_peer.log" |
    awk '{ if ($3 > b) b = $3 } END { if (b) print b }')"
  [[ -n "${best}" && -n "${ours}" ]] &&
    ratio="; train/PyTorch best $(awk -v a="${ours}" -v b="${best}" 'BEGIN { printf "%.2f", a / b }')"
  record pytorch_peer "${state}" $((SECONDS - start)) "${line#PYTORCH PEER: }; train ${ours:-?} tokens/s${ratio}"
}
peer_section

# --- bench: the kernels' speed and the GEMM peak the MFU is taken against.
bench_section() {
  local seconds start=${SECONDS} exe="${bin}/core/ops/cuda/bench" rc state args=()
  unchosen bench && return
  # By default the short bench (5 iterations, no GEMM sweep; the bf16 GEMM
  # peak and the attention rows stay) to fit the run's budget;
  # --full-bench runs all of it with a budget of its own.
  if ((full_bench)); then
    seconds="$(section_seconds bench 240)"
  else
    seconds="$(section_seconds bench 45)"
    args=(--iters=5 --gemm=false --mem_elements=16777216)
  fi
  if [[ ! -x "${exe}" ]]; then
    record bench failed 0 "missing ${exe}"; failures+=("bench(missing)"); return
  fi
  run_logged "${logs}/bench.log" timeout -k 5 "$((seconds > 1 ? seconds : 1))" \
    "${exe}" "${args[@]}"
  rc=$?
  case ${rc} in
    0) state=ok ;;
    124 | 137) state=timeout ;;
    *) state=failed ;;
  esac
  if grep -q 'no CUDA device' "${logs}/bench.log"; then
    state=skipped
    ((expect_gpu)) && state=failed
  fi
  [[ ${state} == ok || ${state} == skipped ]] || failures+=("bench(${state})")
  record bench "${state}" $((SECONDS - start)) "rc=${rc}"
}
bench_section

train_section parity_bf16 60 check_train_parity.sh "TRAIN PARITY" PARITY_PRECISIONS=bf16
train_section cuda_graph 60 check_cuda_graph.sh "CUDA GRAPH"
read -r -a offload_tests <<<"${GPU_CHECK_OFFLOAD_TESTS-core/cuda/activation_offload_test}"
run_tests offload 40 "${offload_tests[@]}"
read -r -a nccl_tests <<<"${GPU_CHECK_NCCL_TESTS-core/comm/nccl_process_group_test}"
run_tests nccl 40 "${nccl_tests[@]}"
train_section multi_rank 60 check_multi_rank.sh "MULTI-RANK"
train_section serve_8b 150 check_serve.sh "SERVE 8B"

summary="$(printf '%s, ' "${states[@]}" | sed 's/, $//')"
if ((${#failures[@]})); then
  printf 'run\tfailed\t%s\t%s\n' "${SECONDS}" "${failures[*]}" >>"${out}/summary.tsv"
  echo "GPU CHECKS: FAILED (${summary}; ${SECONDS} s of ${budget}; failing: ${failures[*]})"
  exit 1
fi
printf 'run\tok\t%s\t\n' "${SECONDS}" >>"${out}/summary.tsv"
echo "GPU CHECKS: ok (${summary}; ${SECONDS} s of ${budget})"
