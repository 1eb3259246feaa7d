# shellcheck shell=bash disable=SC2034
# Shared by the train checks of tools/gpu (sourced, not run):
# check_train_parity.sh, check_gpt2_throughput.sh, check_multi_rank.sh.
#
# bundle_paths DIR sets bin, train, launch, data, logs and LD_LIBRARY_PATH
# for a bundle made by tools/gpu/collect_libs.sh (DIR/bin, DIR/lib,
# DIR/data) or a copied bazel-bin tree.
#
# Environment the checks share:
#   GPU_CHECK_DEVICE   the device under test (default cuda). Tests set cpu,
#                      or test with a bundle holding //tools:train_testdev,
#                      so CI runs the same comparisons without a GPU.
#   GPU_CHECK_GPUS     the GPU count (default: nvidia-smi -L's count).
#   GPU_CHECK_EXTRA_FLAGS  extra train flags for every run (CI: --num-threads 1).
#   GPU_CHECK_CANDIDATE_FLAGS  extra train flags for the runs under test only
#                      (the device run; the parallel layouts): a test plants
#                      a mismatch with "--seed 7" and the check must fail.
#   GPU_CHECK_DEADLINE epoch second by which every run must have ended
#                      (run_checks.sh sets it from its time budget); each
#                      run's timeout is cut to fit, and a run with under
#                      10 s left is not started.
#   STEP_TIMEOUT       the most one train run may take (default 300 s);
#                      each run is killed (timeout -k) when it will not end.
#   GPU_CHECK_TORCH_VENV  the PyTorch environment whose nvidia wheels supply
#                      NCCL, cuBLAS and cuDNN (default /opt/torch/.venv).

bundle_paths() {
  local dir="$1" lib
  bin="${dir}/bin"
  [[ -d "${bin}" ]] || bin="${dir}"
  train="${bin}/tools/train"
  launch="${bin}/tools/launch"
  data="${dir}/data/default_corpus_text_document"
  lib="${dir}/lib"
  [[ -d "${lib}" ]] || lib="${dir}/../lib"
  gpu_library_path "${lib}"
  logs="${dir}/logs"
  mkdir -p "${logs}"
}

# torch_wheel_lib_dirs: the PyTorch environment's nvidia wheel folders
# (GPU_CHECK_TORCH_VENV, default /opt/torch/.venv:
# lib/python3*/site-packages/nvidia/*/lib), one a line. On the GPU machine
# they hold CUDA 13's NCCL (nvidia-nccl-cu13), cuBLAS/cuBLASLt
# (nvidia-cublas), cuDNN (nvidia-cudnn-cu13) and the runtime.
torch_wheel_lib_dirs() {
  local d
  for d in "${GPU_CHECK_TORCH_VENV:-/opt/torch/.venv}"/lib/python3*/site-packages/nvidia/*/lib; do
    [[ -d "${d}" ]] && echo "${d}"
  done
}

# gpu_library_path LIBDIR: exports LD_LIBRARY_PATH for the bundle's
# binaries, once per run (later calls keep it): LIBDIR (what the bundle
# carries: libcudart, oneDNN, protobuf, ...), then LD_LIBRARY_PATH as the
# caller set it, the machine's /usr/local/cuda/lib64, then the PyTorch
# environment's nvidia wheels. So NCCL, cuBLAS and cuDNN, which the bundle
# does not carry, resolve in that order.
gpu_library_path() {
  [[ -n "${GPU_CHECK_LIBRARY_PATH:-}" ]] && return
  local parts=() d
  [[ -d "$1" ]] && parts+=("$(cd "$1" && pwd)")
  [[ -n "${LD_LIBRARY_PATH:-}" ]] && parts+=("${LD_LIBRARY_PATH}")
  parts+=(/usr/local/cuda/lib64)
  while read -r d; do parts+=("${d}"); done < <(torch_wheel_lib_dirs)
  LD_LIBRARY_PATH="$(IFS=:; echo "${parts[*]}")"
  GPU_CHECK_LIBRARY_PATH="${LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH GPU_CHECK_LIBRARY_PATH
}

# A run that aborts (out of device memory is a fatal log line) must end at
# once, not write a core of a process that maps the GPU.
ulimit -c 0

check_device="${GPU_CHECK_DEVICE:-cuda}"
# Word-split on purpose: a flag list.
read -r -a candidate_flags <<<"${GPU_CHECK_CANDIDATE_FLAGS:-}"
read -r -a extra_flags <<<"${GPU_CHECK_EXTRA_FLAGS:-}"

gpu_count() {
  if [[ -n "${GPU_CHECK_GPUS:-}" ]]; then
    echo "${GPU_CHECK_GPUS}"
  elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    nvidia-smi -L | grep -c '^GPU '
  else
    echo 0
  fi
}

# run_timeout SECONDS: SECONDS cut to GPU_CHECK_DEADLINE; prints 0 when under
# 10 s are left (the caller then does not start the run).
run_timeout() {
  local want="$1" left
  if [[ -n "${GPU_CHECK_DEADLINE:-}" ]]; then
    left=$((GPU_CHECK_DEADLINE - $(date +%s)))
    ((left < want)) && want="${left}"
  fi
  ((want < 10)) && want=0
  echo "${want}"
}

# The no-device refusal of --device cuda (training/device_choice.h).
no_device() { grep -q -- "--device ${check_device}: no CUDA device" "$1"; }

# "iteration loss" per line of a --metrics-file.
losses() {
  sed -n 's/.*"iteration": \([0-9]*\),.*"loss": \([^,]*\),.*/\1 \2/p' "$1"
}

# compare_losses REF.jsonl CANDIDATE.jsonl TOLERANCE STEPS LABEL: every
# step's loss within TOLERANCE (relative), all STEPS present in both. Prints
# "LABEL: ok (STEPS steps, max relative difference D; tolerance T)" or
# "LABEL: FAILED (...)" after the steps beyond the tolerance; returns 0 when
# ok.
compare_losses() {
  awk -v tol="$3" -v steps="$4" -v label="$5" '
    NR == FNR { ref[$1] = $2; next }
    ($1 in ref) {
      d = ref[$1] - $2; if (d < 0) d = -d
      m = ref[$1] < 0 ? -ref[$1] : ref[$1]
      r = m > 0 ? d / m : d
      if (r > worst) worst = r
      n++
      if (r > tol) {
        printf "  iteration %d: reference %s, under test %s (relative %.2g)\n", $1, ref[$1], $2, r
        bad++
      }
    }
    END {
      if (n != steps) {
        printf "%s: FAILED (%d common steps, not %d)\n", label, n, steps; exit 1
      }
      if (bad) {
        printf "%s: FAILED (%d of %d steps beyond %s; max relative difference %.2g)\n", label, bad, steps, tol, worst
        exit 1
      }
      printf "%s: ok (%d steps, max relative difference %.2g; tolerance %s)\n", label, steps, worst, tol
    }' <(losses "$1") <(losses "$2")
}

# mean_rate FILE.jsonl WARMUP: "tokens/s TFLOP/s peak_bytes timed_steps" over
# the iterations after the first WARMUP (time-weighted: tokens of the timed
# steps over their total time); nothing when none is left.
mean_rate() {
  awk -v warmup="$2" '
    {
      it = s = tok = tf = mem = ""
      if (match($0, /"iteration": [0-9]+/)) it = substr($0, RSTART + 13, RLENGTH - 13) + 0
      if (match($0, /"seconds_per_iteration": [^,]+/)) s = substr($0, RSTART + 25, RLENGTH - 25) + 0
      if (match($0, /"tokens_per_sec": [^,]+/)) tok = substr($0, RSTART + 18, RLENGTH - 18) + 0
      if (match($0, /"tflops": [^,]+/)) tf = substr($0, RSTART + 10, RLENGTH - 10) + 0
      if (match($0, /"mem_peak_bytes": [0-9]+/)) mem = substr($0, RSTART + 18, RLENGTH - 18) + 0
      if (mem > peak) peak = mem
      if (it <= warmup || s <= 0) next
      n++; secs += s; tokens += tok * s; flops += tf * s
    }
    END { if (n > 0) printf "%.6g %.6g %d %d\n", tokens / secs, flops / secs, peak, n }' \
    "$1" 2>/dev/null
}
