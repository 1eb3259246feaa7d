#!/usr/bin/env bash
# Builds every libFuzzer target (tag fuzz_target) under --config=fuzz and runs
# each for a bounded time, starting from its checked-in seed corpus. Prints
# one line per target (executions, exec/s, corpus growth, crashes) and exits
# non-zero when any fuzzer found a crash, a leak, a timeout or ran out of
# memory; the input is left under WORK/artifacts/TARGET/.
#
#   tools/fuzz/run_all.sh [--seconds N] [--parallel P] [--work DIR]
#                         [--no-build] [TARGET_LABEL...]
#
# CI runs it with --seconds 60; a longer run (--seconds 600) is the benchmark
# whose figures docs/benchmarks/2026-12-01.md ("Fuzzing") records.
set -uo pipefail
cd "$(dirname "$0")/../.."

seconds=60
parallel=1
work=""
build=1
targets=()
while (($# > 0)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --parallel) parallel=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
work=${work:-$(mktemp -d /tmp/fuzz_work.XXXXXX)}
mkdir -p "${work}"

bazel_flags=(--config=fuzz ${FUZZ_BAZEL_FLAGS:-})
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(tools/bazel query 'attr(tags, "fuzz_target", //...)' 2>/dev/null)
fi
if ((${#targets[@]} == 0)); then
  echo "run_all.sh: no fuzz targets found" >&2
  exit 1
fi
if ((build)); then
  tools/bazel build "${bazel_flags[@]}" "${targets[@]}" || exit 1
fi
bin_dir=$(tools/bazel info "${bazel_flags[@]}" bazel-bin 2>/dev/null)

# Runs one fuzzer; its summary line goes to WORK/NAME.summary.
run_one() {
  local label=$1
  local pkg=${label#//}
  pkg=${pkg%%:*}
  local name=${label##*:}
  local base=${name%_fuzz_test_fuzzer}
  local bin="${bin_dir}/${pkg}/${name}"
  local seeds="${PWD}/${pkg}/corpus/${base}"
  local corpus="${work}/corpus/${base}"
  local artifacts="${work}/artifacts/${base}/"
  local log="${work}/${base}.log"
  mkdir -p "${corpus}" "${artifacts}"
  # From the runfiles root, so data files resolve as under bazel test.
  (cd "${bin}.runfiles/megatron_cpp" 2>/dev/null || cd "${PWD}"
   "${bin}" -max_total_time="${seconds}" -timeout=20 -rss_limit_mb=2560 \
     -print_final_stats=1 -artifact_prefix="${artifacts}" \
     "${corpus}" "${seeds}") >"${log}" 2>&1
  local rc=$?
  local execs rate units crashes
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "${log}" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "${log}" | tail -1)
  units=$(find "${corpus}" -type f | wc -l)
  crashes=$(find "${artifacts}" -type f | wc -l)
  printf '%-28s %12s execs %8s exec/s %6s corpus %3s crashes (rc %d) %s\n' \
    "${base}" "${execs:-?}" "${rate:-?}" "${units}" "${crashes}" "${rc}" \
    "${log}" >"${work}/${base}.summary"
}

start=$(date +%s)
running=0
for label in "${targets[@]}"; do
  run_one "${label}" &
  running=$((running + 1))
  if ((running >= parallel)); then
    wait -n
    running=$((running - 1))
  fi
done
wait

status=0
echo "=== fuzzing: ${#targets[@]} target(s), ${seconds}s each, ${parallel} at a time, $(( $(date +%s) - start ))s; work dir ${work}"
for label in "${targets[@]}"; do
  base=${label##*:}
  base=${base%_fuzz_test_fuzzer}
  cat "${work}/${base}.summary"
  if ! grep -q ' 0 crashes (rc 0)' "${work}/${base}.summary"; then
    status=1
    echo "--- ${base}: last lines of ${work}/${base}.log"
    grep -E 'ERROR|SUMMARY|runtime error|Check failed|artifact' "${work}/${base}.log" | head -8
  fi
done
exit ${status}
