#!/usr/bin/env bash
# The GPU machine's whole call, rehearsed here without a GPU, so the script
# cannot rot before its first (scarce) run:
# - bundle: collect_libs.sh gathers the real binaries (every one run_checks
#   runs, and //tools:train_testdev standing in for train); check_bundle.sh
#   finds every DT_NEEDED carried or on the GPU machine, and the packed
#   bundle (xz -1: no smaller than make_bundle's xz -6) plus the working
#   tree allowance fits 48 MiB; a bundle missing a library fails, naming it.
# - libraries: gpu_library_path puts the bundle's lib/ first, then
#   LD_LIBRARY_PATH, /usr/local/cuda/lib64, then the PyTorch environment's
#   nvidia wheel folders (a fake venv here).
# - run_checks.sh on the packed bundle, --out a folder, the test device for
#   the train checks: every section in order in summary.tsv, run.log ending
#   with "GPU CHECKS: ok", logs.tgz holding the logs.
# - a hung test is killed at TEST_TIMEOUT (timeout -k) and the next runs;
#   a section without budget reads not-run, and the run fails.
# - killed with TERM: summary.tsv says so and logs.tgz is there.
# - a GPU expected but not visible (no GPU here): preflight fails, naming
#   cudaGetDeviceCount's error, and nothing else runs; with a GPU expected
#   a test skipped for want of a device fails, one skipped by design not.
#   run_checks_test.sh TRAIN_TESTDEV TREE_ALLOWANCE_MIB
set -uo pipefail
train_dev="$PWD/$1"
tree_allowance_mib="$2"
serve_dev="$PWD/$3"
scripts="$(cd "$(dirname "$0")" && pwd)"
work="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
pass() { echo "PASS $*"; }

# --- bundle
export COLLECT_BIN_ROOT="$PWD"
bundle="${work}/gpu_bundle"
"${scripts}/collect_libs.sh" "${bundle}" 2>&1 | tail -1 || fail "collect_libs"
[[ -f "${bundle}/lib/libcudart.so.13" ]] && pass "libcudart carried" ||
  fail "libcudart.so.13 not carried"
for name in libnccl.so.2 libcublas.so.13 libcublasLt.so.13; do
  [[ ! -e "${bundle}/lib/${name}" ]] || fail "${name} carried (the wheels supply it)"
done
# make_bundle.sh's window (the fatbin copies), at a faster preset.
tar -C "${work}" -cf - gpu_bundle | xz -T0 --lzma2=preset=1,dict=192MiB >"${work}/gpu_bundle.tar.xz"
out="$("${scripts}/check_bundle.sh" "${bundle}" "${work}/gpu_bundle.tar.xz" \
  $((tree_allowance_mib * 1048576)) 2>&1)"
rc=$?
echo "${out}" | tail -1
[[ ${rc} -eq 0 ]] && grep -q '^BUNDLE: ok' <<<"${out}" && pass "bundle: libraries and size" ||
  fail "bundle check: ${out}"
cp -a "${bundle}" "${work}/broken"
rm "${work}/broken/lib/libcrypto.so.3"
out="$("${scripts}/check_bundle.sh" "${work}/broken" 2>&1)"
grep -q 'needs libcrypto.so.3, neither carried nor on the GPU machine' <<<"${out}" &&
  grep -q '^BUNDLE: FAILED' <<<"${out}" && pass "bundle missing libcrypto fails" ||
  fail "bundle missing libcrypto: ${out}"
out="$(GPU_BUNDLE_BUDGET_MIB=1 "${scripts}/check_bundle.sh" "${bundle}" \
  "${work}/gpu_bundle.tar.xz" 0 2>&1)"
grep -q 'exceed 1 MiB' <<<"${out}" && pass "bundle over budget fails" ||
  fail "bundle over budget: ${out}"

# --- library search path, with a PyTorch environment's wheels.
venv="${work}/venv"
mkdir -p "${venv}/lib/python3.12/site-packages/nvidia/nccl/lib" \
  "${venv}/lib/python3.12/site-packages/nvidia/cu13/lib"
path="$(env -u GPU_CHECK_LIBRARY_PATH LD_LIBRARY_PATH=/x GPU_CHECK_TORCH_VENV="${venv}" \
  bash -c "source '${scripts}/check_lib.sh'; gpu_library_path '${bundle}/lib'; echo \"\${LD_LIBRARY_PATH}\"")"
want="${bundle}/lib:/x:/usr/local/cuda/lib64:${venv}/lib/python3.12/site-packages/nvidia/cu13/lib:${venv}/lib/python3.12/site-packages/nvidia/nccl/lib"
[[ "${path}" == "${want}" ]] && pass "library path: bundle, LD_LIBRARY_PATH, cuda, wheels" ||
  fail "library path ${path}, want ${want}"

# --- the rehearsal: train_testdev as train, the packed bundle.
cp -L "${train_dev}" "${bundle}/bin/tools/train"
cp -L "${serve_dev}" "${bundle}/bin/tools/serve/serve"
rm -rf "${work}/gpu_bundle.tar.xz" "${work}/broken"
tar -C "${work}" -cf - gpu_bundle | xz -0 -T0 >"${work}/gpu_bundle.tar.xz"
rm -rf "${bundle}"
export GPU_CHECK_DEVICE=test GPU_CHECK_GPUS=1
export GPU_CHECK_EXTRA_FLAGS="--num-threads 1 --num-layers 2 --seq-length 32"
export PARITY_STEPS=4 CUDA_GRAPH_STEPS=4 THROUGHPUT_MICRO_BATCHES=4 THROUGHPUT_ITERS=5
export THROUGHPUT_MODEL_FLAGS="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --vocab-size 512 --bf16"
export GPU_CHECK_TORCH_VENV="${venv}"
# The peer with a tiny model where torch is installed; skipped where not.
export GPU_CHECK_PYTHON=python3
export PEER_ARGS="--layers 2 --hidden 64 --heads 4 --seq 64 --vocab 512 --steps 2 --warmup 1 --modes eager"
# serve_testdev as serve: a tiny random-weight Llama on the test device.
export SERVE_DEVICE=test SERVE_CLIENTS="1 4" SERVE_MAX_TOKENS=8 SERVE_PROMPT_CHARS=32
export SERVE_MODEL_FLAGS="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --group-query-attention --num-query-groups 2 --ffn-hidden-size 128 --vocab-size 1000 --seq-length 128 --max-position-embeddings 128 --position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights --disable-bias-linear"
export SERVE_FLAGS="--max-batch-size 8 --kv-cache-bytes 8000000 --num-threads 1 --cuda-graph"
export SERVE_PEER_ARGS="--layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 1000"
start=${SECONDS}
"${scripts}/run_checks.sh" --no-expect-gpu --quick --out "${work}/out" "${bundle}" \
  >"${work}/rehearsal.txt" 2>&1
rc=$?
echo "rehearsal: rc ${rc} in $((SECONDS - start)) s"
sections="$(cut -f1,2 "${work}/out/summary.tsv" | tr '\t\n' ' ;')"
want_sections="section state;preflight ok;kernels ok;parity_fp32 ok;moe_parity ok;moe_gemm skipped;parity_gpt2 ok;parity_offload ok;gpt2_throughput ok;pytorch_peer skipped;bench skipped;parity_bf16 ok;cuda_graph ok;offload ok;nccl ok;multi_rank skipped;serve_8b ok;run ok;"
if [[ ${rc} -eq 0 && "${sections}" == "${want_sections}" ]] &&
  tail -1 "${work}/out/run.log" | grep -q '^GPU CHECKS: ok (preflight ok, kernels ok' &&
  tar -tzf "${work}/out/logs.tgz" >"${work}/out.list" &&
  grep -q 'logs/parity_fp32.log' "${work}/out.list"; then
  pass "rehearsal: every section, summary.tsv, run.log, logs.tgz"
else
  fail "rehearsal rc ${rc}; sections: ${sections}"
  cat "${work}/rehearsal.txt"
fi
grep -q 'libcudart.so.13 *.*/gpu_bundle/lib/libcudart.so.13' "${work}/rehearsal.txt" &&
  pass "preflight prints resolved libraries" || fail "preflight did not print libcudart's file"

# --- --sections runs only the named sections; the others are not-chosen,
# which is not a failure.
"${scripts}/run_checks.sh" --no-expect-gpu --sections moe_gemm,parity_offload \
  --out "${work}/out_sections" "${bundle}" >"${work}/sections.txt" 2>&1
rc=$?
chosen="$(cut -f1,2 "${work}/out_sections/summary.tsv" | tr '\t\n' ' ;')"
want_chosen="section state;preflight ok;kernels not-chosen;parity_fp32 not-chosen;moe_parity not-chosen;moe_gemm skipped;parity_gpt2 not-chosen;parity_offload ok;gpt2_throughput not-chosen;pytorch_peer not-chosen;bench not-chosen;parity_bf16 not-chosen;cuda_graph not-chosen;offload not-chosen;nccl not-chosen;multi_rank not-chosen;serve_8b not-chosen;run ok;"
if [[ ${rc} -eq 0 && "${chosen}" == "${want_chosen}" ]]; then
  pass "--sections runs the chosen sections only"
else
  fail "--sections: rc ${rc}; sections: ${chosen}"
  cat "${work}/sections.txt"
fi

# --- a hung test is killed and the next one runs; a spent budget fails.
mkdir -p "${bundle}/bin/hang"
printf '#!/bin/sh\ntrap "" TERM\nsleep 600\n' >"${bundle}/bin/hang/hang_test"
chmod +x "${bundle}/bin/hang/hang_test"
# Only the two sections it checks run (the others took 61 s on a loaded
# machine); the hung test sleeps 600 s, so under 300 s shows it was killed.
start=${SECONDS}
GPU_CHECK_TESTS="hang/hang_test core/cuda/runtime_nodevice_test" TEST_TIMEOUT=3 \
  SECTION_BUDGET_parity_fp32=0 "${scripts}/run_checks.sh" --no-expect-gpu \
  --sections kernels,parity_fp32 \
  --out "${work}/out_hang" "${bundle}" >"${work}/hang.txt" 2>&1
rc=$?
if [[ ${rc} -ne 0 ]] && grep -q '^TIMEOUT hang/hang_test after 3 s' "${work}/hang.txt" &&
  grep -q '^PASS core/cuda/runtime_nodevice_test' "${work}/hang.txt" &&
  grep -qP '^parity_fp32\tnot-run' "${work}/out_hang/summary.tsv" &&
  ((SECONDS - start < 300)); then
  pass "hung test killed (TERM ignored), next test runs, spent budget is not-run"
else
  fail "hung test: rc ${rc} after $((SECONDS - start)) s"
  cat "${work}/hang.txt"
fi

# --- killed with TERM: what finished is kept.
# As the device tool stops a call: TERM to the whole process group.
GPU_CHECK_TESTS="hang/hang_test" TEST_TIMEOUT=60 setsid "${scripts}/run_checks.sh" \
  --no-expect-gpu --out "${work}/out_term" "${bundle}" >"${work}/term.txt" 2>&1 &
pid=$!
for _ in $(seq 50); do
  grep -qP '^preflight\tok' "${work}/out_term/summary.tsv" 2>/dev/null && break
  sleep 0.2
done
sleep 1
start=${SECONDS}
kill -TERM -- -"${pid}"
wait "${pid}"
((SECONDS - start < 10)) || fail "killed with TERM: took $((SECONDS - start)) s to stop"
if grep -qP '^run\tkilled\t[0-9]+\tTERM' "${work}/out_term/summary.tsv" &&
  tar -tzf "${work}/out_term/logs.tgz" >"${work}/term.list" &&
  grep -q 'logs/preflight.log' "${work}/term.list"; then
  pass "killed with TERM: summary.tsv and logs.tgz kept"
else
  fail "killed with TERM"
  cat "${work}/term.txt" "${work}/out_term/summary.tsv"
fi

# --- a GPU expected but not visible: red, saying why.
if [[ ! -e /dev/nvidia0 ]]; then
  "${scripts}/run_checks.sh" --expect-gpu --out "${work}/out_nogpu" "${bundle}" \
    >"${work}/nogpu.txt" 2>&1
  rc=$?
  if [[ ${rc} -ne 0 ]] &&
    tail -1 "${work}/nogpu.txt" | grep -q '^GPU CHECKS: FAILED (preflight: PREFLIGHT: FAILED (GPU expected but the CUDA runtime sees none: cudaGetDeviceCount' &&
    [[ "$(cut -f1,2 "${work}/out_nogpu/summary.tsv" | tail -1)" == "preflight	failed" ]]; then
    pass "GPU expected, none visible: fails naming the CUDA error"
  else
    fail "GPU expected without one: rc ${rc}"
    cat "${work}/nogpu.txt"
  fi
fi

# --- with a GPU expected, a skip for want of a device fails and a skip by
# design (two GPUs needed) does not. The device probe is stubbed: there is
# no GPU here.
mkdir -p "${bundle}/bin/fake"
printf '#!/bin/sh\nexit 0\n' >"${bundle}/bin/core/cuda/runtime_nodevice_test"
printf '#!/bin/sh\necho "x_test.cc:1: Skipped"\necho "no CUDA device (stub)"\necho "[  SKIPPED ] X.Y (0 ms)"\n' \
  >"${bundle}/bin/fake/nodevice_skip_test"
printf '#!/bin/sh\necho "x_test.cc:1: Skipped"\necho "needs two CUDA devices"\necho "[  SKIPPED ] X.Z (0 ms)"\n' \
  >"${bundle}/bin/fake/two_gpu_skip_test"
printf '#!/bin/sh\necho "[  FAILED  ] X.W blocking=${CUDA_LAUNCH_BLOCKING:-0}"\nexit 1\n' \
  >"${bundle}/bin/fake/failing_test"
chmod +x "${bundle}/bin/core/cuda/runtime_nodevice_test" "${bundle}/bin/fake/"*
GPU_CHECK_TESTS="fake/nodevice_skip_test fake/two_gpu_skip_test fake/failing_test" GPU_CHECK_OFFLOAD_TESTS= \
  GPU_CHECK_NCCL_TESTS= RUN_CHECKS_BUDGET=30 SECTION_BUDGET_parity_fp32=0 \
  SECTION_BUDGET_moe_parity=0 SECTION_BUDGET_moe_gemm=0 \
  SECTION_BUDGET_parity_gpt2=0 SECTION_BUDGET_parity_offload=0 SECTION_BUDGET_gpt2_throughput=0 SECTION_BUDGET_pytorch_peer=0 \
  SECTION_BUDGET_bench=0 SECTION_BUDGET_parity_bf16=0 SECTION_BUDGET_cuda_graph=0 \
  SECTION_BUDGET_multi_rank=0 SECTION_BUDGET_serve_8b=0 "${scripts}/run_checks.sh" --expect-gpu \
  --out "${work}/out_skips" "${bundle}" >"${work}/skips.txt" 2>&1
if grep -q '^FAIL fake/nodevice_skip_test: 1 tests skipped for want of a CUDA device' "${work}/skips.txt" &&
  grep -q '^PASS fake/two_gpu_skip_test (1 skipped)' "${work}/skips.txt" &&
  grep -q '^FAIL fake/failing_test rc=1' "${work}/skips.txt" &&
  grep -q 'rerun with CUDA_LAUNCH_BLOCKING=1: rc=1 (log failing_test.blocking.log)' "${work}/skips.txt" &&
  tar -xzOf "${work}/out_skips/logs.tgz" logs/failing_test.blocking.log | grep -q 'blocking=1'; then
  pass "GPU expected: a no-device skip fails, a two-GPU skip passes; a failure reruns with CUDA_LAUNCH_BLOCKING=1"
else
  fail "skips with a GPU expected"
  cat "${work}/skips.txt"
fi

# --- a machine whose glibc is older than the one the bundle was built
# against: preflight names the symbol version (ldd stubbed to say so).
mkdir -p "${work}/oldlibc"
printf '#!/bin/sh\necho "ldd: $1: /lib/libc.so.6: version \`GLIBC_2.99'"'"' not found (required by $1)"\n' \
  >"${work}/oldlibc/ldd"
chmod +x "${work}/oldlibc/ldd"
out="$(PATH="${work}/oldlibc:${PATH}" "${scripts}/preflight.sh" "${bundle}" 2>&1)"
grep -q "^PREFLIGHT: FAILED (missing GLIBC_2.99 (the machine's library is older))" <<<"${out}" &&
  pass "preflight names a glibc too old" || fail "old glibc: $(tail -3 <<<"${out}")"

if ((failures)); then
  echo "${failures} check(s) failed"
  exit 1
fi
echo "run_checks rehearsal: OK"
