#!/usr/bin/env bash
# Benchmarks tools/train at --preset bench (fp32, then --bf16) and the PyTorch
# eager baseline (tools/bench/pytorch_gpt_baseline.py) on the same model and
# batch, one after the other, and prints a summary table. Builds nothing.
#
#   tools/bazel run //tools/bench:train_vs_pytorch
#   tools/bench/run_train_bench.sh [TRAIN_BINARY] [PYTORCH_SCRIPT]
#
# Environment: TRAIN_ITERS (ours, default 20; the first log interval of 5 is
# warm-up and left out), TORCH_WARMUP / TORCH_ITERS (default 2 / 5 for fp32),
# TORCH_BF16_WARMUP / TORCH_BF16_ITERS (default 1 / 2: PyTorch's bf16 GEMM
# has no fast path on AVX2), THREADS (default 2), SKIP_BF16=1, ROUNDS
# (default 3: alternating short fp32 runs of ours and PyTorch, so both see
# the same load on a shared machine; the median round's ratio is printed).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
train="${1:-bazel-bin/tools/train}"
script="${2:-${here}/pytorch_gpt_baseline.py}"
train="$(realpath "${train}")"
script="$(realpath "${script}")"
threads="${THREADS:-2}"
iters="${TRAIN_ITERS:-20}"
python=/usr/bin/python3

if [[ ! -x "${train}" ]]; then
  echo "run_train_bench: ${train} not found; run 'tools/bazel build //tools:train' first" >&2
  exit 1
fi
# Debian's python3-torch (1.13) uses the system libblas.so.3; the reference
# BLAS that satisfies its dependency runs a GEMM at ~3 GFLOP/s, so OpenBLAS
# (OpenMP build, like torch) is installed beside it for a fair baseline.
if ! "${python}" -c "import torch" 2>/dev/null ||
   ! dpkg-query -W -f='${Status}' libopenblas0-openmp 2>/dev/null | grep -q "install ok installed"; then
  if [[ "$(id -u)" != 0 ]]; then
    echo "run_train_bench: needs python3-torch and libopenblas0-openmp; as root: apt-get install -y python3-torch libopenblas0-openmp" >&2
    exit 1
  fi
  echo "run_train_bench: installing python3-torch libopenblas0-openmp" >&2
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends python3-torch libopenblas0-openmp >&2
fi

log_dir="$(mktemp -d)"
trap 'rm -rf "${log_dir}"' EXIT
export OMP_NUM_THREADS="${threads}" MCC_NUM_THREADS="${threads}"

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
isa="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile)$' | tr '\n' ' ')"
echo "ISA: ${isa:-no AVX2}"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"

# Ours: mean tokens/s and MFU over log lines after the first (warm-up).
run_ours() {
  local name="$1"
  shift
  echo "== ours ${name}: ${train} --preset bench --train-iters ${iters} $*"
  "${train}" --preset bench --train-iters "${iters}" "$@" >"${log_dir}/${name}.log" 2>&1 || {
    tail -20 "${log_dir}/${name}.log" >&2
    return 1
  }
  grep -E "GEMM peak|tokens/s|bf16 GEMM|^.*\]   m=[0-9]+ n=" "${log_dir}/${name}.log" | sed 's/^.*\] //' |
    sed -E 's/ \| (consumed|learning|loss scale|skipped|memory)[^|]*//g'
}
summarise_ours() {
  awk '/tokens\/s:/ {
         n++; if (n == 1) next
         for (i = 1; i <= NF; i++) {
           if ($i == "tokens/s:") t += $(i + 1)
           if ($i == "MFU:") { m += $(i + 1) + 0 }
         }
         k++
       }
       END { if (k == 0) { print "nan nan"; exit }
             printf "%.1f %.1f\n", t / k, m / k }' "$1"
}

run_ours fp32
[[ "${SKIP_BF16:-0}" == 1 ]] || run_ours bf16 --bf16

echo "== pytorch (${python} ${script})"
"${python}" "${script}" --threads "${threads}" --precision fp32 \
  --warmup "${TORCH_WARMUP:-2}" --iters "${TORCH_ITERS:-5}" | tee "${log_dir}/torch.log"
if [[ "${SKIP_BF16:-0}" != 1 ]]; then
  "${python}" "${script}" --threads "${threads}" --precision bf16 \
    --warmup "${TORCH_BF16_WARMUP:-1}" --iters "${TORCH_BF16_ITERS:-2}" |
    grep "tokens/s" | tee -a "${log_dir}/torch.log"
fi

torch_tps() {
  awk -v p="$1" '$1 == "pytorch" && $2 == p { print $4 }' "${log_dir}/torch.log"
}
echo
echo "| precision | ours tokens/s | ours MFU | GEMM peak (GFLOP/s) | PyTorch tokens/s | ours / PyTorch | goal |"
echo "|---|---|---|---|---|---|---|"
fp32_tps=""
for p in fp32 bf16; do
  [[ -f "${log_dir}/${p}.log" ]] || continue
  read -r tps mfu < <(summarise_ours "${log_dir}/${p}.log")
  [[ "${p}" == fp32 ]] && fp32_tps="${tps}"
  peak="$(grep -o 'GEMM peak for MFU: [0-9.]*' "${log_dir}/${p}.log" | awk '{print $NF}')"
  ref="$(torch_tps "${p}")"
  goal="MFU >= 85%"
  [[ "${p}" == bf16 ]] && goal=">= 1.3x PyTorch, >= fp32 tokens/s"
  ratio="$(awk -v a="${tps}" -v b="${ref:-0}" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }')"
  echo "| ${p} | ${tps} | ${mfu}% | ${peak:-given} | ${ref:-n/a} | ${ratio} | ${goal} |"
  if [[ "${p}" == bf16 && -n "${fp32_tps}" ]]; then
    bf16_over_fp32="$(awk -v a="${tps}" -v b="${fp32_tps}" 'BEGIN { if (b > 0) printf "%.2fx", a / b; else print "n/a" }')"
  fi
done
[[ -n "${bf16_over_fp32:-}" ]] && echo "bf16 / fp32 tokens/s: ${bf16_over_fp32} (goal >= 1.00x)"

# Alternating rounds: ours (10 iterations, the second log interval timed)
# then PyTorch (1 warm-up, 3 timed steps), ROUNDS times.
rounds="${ROUNDS:-3}"
if (( rounds > 0 )); then
  echo
  echo "alternating fp32 rounds (ours 10 iterations, PyTorch 3 steps, one after the other):"
  ratios=()
  for ((r = 1; r <= rounds; r++)); do
    "${train}" --preset bench --train-iters 10 >"${log_dir}/round.log" 2>&1
    ours="$(summarise_ours "${log_dir}/round.log" | cut -d' ' -f1)"
    theirs="$("${python}" "${script}" --threads "${threads}" --precision fp32 \
      --warmup 1 --iters 3 | awk '$1 == "pytorch" && $2 == "fp32" { print $4 }')"
    ratio="$(awk -v a="${ours}" -v b="${theirs}" 'BEGIN { printf "%.2f", a / b }')"
    ratios+=("${ratio}")
    echo "  round ${r}: ours ${ours} tokens/s, PyTorch ${theirs} tokens/s, ratio ${ratio}x (load $(cut -d' ' -f1 /proc/loadavg))"
  done
  median="$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')"
  echo "  median ratio ${median}x (goal >= 2x)"
fi
