#!/usr/bin/env bash
# Compares two builds of tools/train at --preset bench (fp32 and --bf16) in
# the same run: alternating rounds, so both see the same machine load, and
# prints each build's median tokens/s and the ratio NEW / BASE. For checking
# that a refactor keeps the speed (BENCHMARKS.md). Builds nothing.
#
#   tools/bench/compare_train.sh BASE_TRAIN NEW_TRAIN
#
# Environment: ROUNDS (default 5), TRAIN_ITERS (default 15; the first log
# interval is warm-up and left out), THREADS (default 2), EXTRA_FLAGS.
set -euo pipefail
base="$(realpath "$1")"
new="$(realpath "$2")"
rounds="${ROUNDS:-5}"
iters="${TRAIN_ITERS:-15}"
threads="${THREADS:-2}"
export OMP_NUM_THREADS="${threads}" MCC_NUM_THREADS="${threads}"
log="$(mktemp -d)"
trap 'rm -rf "${log}"' EXIT

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"

tps() {  # mean tokens/s over the log lines after the first
  awk '/tokens\/s:/ { n++; if (n == 1) next
         for (i = 1; i <= NF; i++) if ($i == "tokens/s:") t += $(i + 1); k++ }
       END { if (k == 0) print "nan"; else printf "%.1f\n", t / k }' "$1"
}
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

for precision in fp32 bf16; do
  flags=(--preset bench --train-iters "${iters}" ${EXTRA_FLAGS:-})
  [[ "${precision}" == bf16 ]] && flags+=(--bf16)
  : >"${log}/base.${precision}"
  : >"${log}/new.${precision}"
  for ((r = 0; r < rounds; r++)); do
    for which in base new; do
      bin="${base}"
      [[ "${which}" == new ]] && bin="${new}"
      "${bin}" "${flags[@]}" >"${log}/run.log" 2>&1 || {
        tail -20 "${log}/run.log" >&2
        exit 1
      }
      tps "${log}/run.log" >>"${log}/${which}.${precision}"
    done
  done
  b="$(median <"${log}/base.${precision}")"
  n="$(median <"${log}/new.${precision}")"
  echo "${precision}: base $(tr '\n' ' ' <"${log}/base.${precision}")-> median ${b}; new $(tr '\n' ' ' <"${log}/new.${precision}")-> median ${n}; new/base $(awk -v a="${n}" -v b="${b}" 'BEGIN { printf "%.3f", a / b }')"
done
