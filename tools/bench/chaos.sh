#!/usr/bin/env bash
# Chaos runs: N trainings under tools/launch (4 ranks, TP 2 x DP 2, async
# checkpoint saves every 3 iterations, local checkpoints every iteration
# with --replication, --distributed-timeout-minutes 0.1,
# --exit-signal-handler), each with one fault, the modes in turn:
#   time    a random rank SIGKILLed at a random moment (mid-forward,
#           mid-collective);
#   save:*  a rank SIGKILLed mid-save through the writer's fault hook
#           (MCC_CHAOS_KILL_AT_SAVE): after a shard, after the files' fsync,
#           after the metadata, just before the directory's rename, or after
#           the commit;
#   stop    a random rank SIGSTOPped at a random moment (a hung node);
#   term    the launcher SIGTERMed at a random moment (SLURM's warning).
# After each run it checks that
#   - the job ended within 30 s of the fault (else: a hang),
#   - the launcher named the dead rank (time, save), or tools/analyze_hang
#     named the stopped one from the others' flight-recorder dumps (stop;
#     the launcher names it when it stopped after the job's last collective,
#     --rank-exit-timeout-s), or
#     the job saved and exited 0 (term, unless it had already finished),
#   - no process of the job was left behind,
#   - the latest checkpoint loads (checksums verified on read), and resuming
#     from it reproduces the uninterrupted run's losses bit for bit: twice,
#     from a copy of the shared directory alone and from the local
#     checkpoints (which win when at least as new; every other run the
#     victim's own local directory is deleted first, a replaced node, so
#     its copies come from its peer).
# For each fault with a known moment it reports the seconds from the fault
# to resumed training (the job's end, then the resumed job's launch to its
# first iteration) and to regained progress (to the iteration the faulted
# run had reached), from the local copies against from the shared
# directory. Both resume in turn from the same fault, in the same run.
#
#   tools/bazel run //tools/bench:chaos -- [N]       (default 100)
#   tools/bench/chaos.sh LAUNCH TRAIN ANALYZE_HANG [N]
# Environment: SEED (default 1). Exits non-zero when any run failed a check.
set -uo pipefail
launch="$(realpath "$1")"
train="$(realpath "$2")"
analyze_hang="$(realpath "$3")"
runs="${4:-100}"
RANDOM="${SEED:-1}"
work="${TEST_TMPDIR:-$(mktemp -d)}/chaos"
rm -rf "${work}" && mkdir -p "${work}"
common=(--mock-data --vocab-size 256 --num-layers 2 --hidden-size 32
        --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
        --global-batch-size 8 --eval-iters 0 --log-interval 1
        --train-iters 12 --lr-decay-iters 12 --num-threads 1
        --tensor-model-parallel-size 2 --distributed-timeout-minutes 0.1
        --exit-signal-handler)

local_flags=(--non-persistent-ckpt-type local --non-persistent-save-interval 1
             --replication)
losses() { sed -n 's/.*"iteration": \([0-9]*\),.*"loss": \([^,]*\),.*/\1 \2/p' "$1"; }
last_losses() { losses "$1" | awk '{ l[$1] = $2 } END { for (i in l) print i, l[i] }' | sort -n; }
now() { date +%s.%N; }
# A run whose fault took effect: counted by mode, with the time from the
# fault (died) to the job's end (ended) when the fault's moment is known.
count_fault() {
  faults=$((faults + 1))
  count[${mode}]=$((${count[${mode}]:-0} + 1))
  [[ -n "${died}" ]] && timed=1 && awk -v a="${died}" -v b="${ended}" 'BEGIN { printf "%.2f\n", b - a }' >>"${work}/death_to_exit"
  return 0
}
# PIDs of processes whose environment holds MCC_CHAOS_RUN=$1 (one grep over
# /proc: the job's ranks and anything they started).
job_pids() {
  grep -lsxz "MCC_CHAOS_RUN=$1" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | grep -vx "$$"
}
# resume_timed OUT FLAGS...: resumes the run's job with FLAGS, writing
# OUT.jsonl and OUT.log; sets rc, first_s (launch to the first resumed
# iteration logged) and back_s (launch to the iteration the faulted run had
# reached, ${reached}), polling the metrics file.
resume_timed() {
  local out=$1 t0 pid last
  shift
  t0=$(now)
  MCC_CHAOS_RUN="${i}r" "${launch}" --nproc_per_node 4 -- "${train}" "${common[@]}" "$@" \
    --metrics-file "${out}.jsonl" >"${out}.log" 2>&1 &
  pid=$!
  first_s="" back_s=""
  while kill -0 "${pid}" 2>/dev/null && [[ -z "${back_s}" ]]; do
    last=$(losses "${out}.jsonl" 2>/dev/null | tail -1 | cut -d' ' -f1)
    if [[ -n "${last}" ]]; then
      [[ -z "${first_s}" ]] && first_s=$(awk -v a="${t0}" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
      ((last >= reached)) && back_s=$(awk -v a="${t0}" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
    fi
    sleep 0.02
  done
  wait "${pid}"
  rc=$?
  # Faster than the poll: the job's end bounds both.
  local end_s
  end_s=$(awk -v a="${t0}" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
  [[ -z "${first_s}" ]] && first_s=${end_s}
  [[ -z "${back_s}" ]] && back_s=${end_s}
  return 0
}
# check_history OUT WHAT: the killed run's losses overridden by the resumed
# run's (OUT.jsonl) must be the uninterrupted run's, all 12 iterations.
check_history() {
  if [[ "${rc}" == 0 ]]; then
    cat "${dir}/killed.jsonl" "$1.jsonl" >"$1.history.jsonl" 2>/dev/null
    if diff -q <(last_losses "${work}/ref.jsonl") <(last_losses "$1.history.jsonl") >/dev/null; then
      exact=$((exact + 1))
    else
      mismatched=$((mismatched + 1))
      echo "run ${i} (${what}, rank ${victim}): the losses resumed $2 differ from the uninterrupted run's"
    fi
  else
    corrupted=$((corrupted + 1))
    echo "run ${i} (${what}, rank ${victim}): resuming $2 failed:"
    tail -5 "$1.log"
  fi
}
first_iteration() { losses "$1" | head -1 | awk '{ print $1 - 1 }'; }
# p50 and max of a file of numbers.
summary() {
  sort -g "$1" | awk '{ a[NR] = $1 } END { if (NR) printf "p50 %s s, max %s s (%d faults)", a[int((NR + 1) / 2)], a[NR], NR; else print "n/a" }'
}
rank_pid() {  # $1 launcher pid, $2 rank: among the launcher's children
  for p in $(pgrep -P "$1"); do
    grep -qsxz "RANK=$2" "/proc/${p}/environ" && echo "${p}" && return
  done
}

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
start=$(now)
MCC_CHAOS_RUN=ref "${launch}" --nproc_per_node 4 -- "${train}" "${common[@]}" \
  --metrics-file "${work}/ref.jsonl" >"${work}/ref.log" 2>&1 || { cat "${work}/ref.log"; exit 1; }
ref_seconds=$(awk -v a="${start}" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
echo "uninterrupted run: ${ref_seconds} s"

# Every other run kills at a random moment; the others cycle the save steps.
# The first four (CI's smoke test) try each kind of fault once.
modes=(time save:shard stop term save:files_synced save:metadata_written
       time save:renaming stop save:committed term save:shard)
declare -A count
faults=0; hangs=0; unnamed=0; unsaved=0; leftovers=0; corrupted=0; exact=0; mismatched=0; no_fault=0
: >"${work}/death_to_exit"
for f in local_first shared_first local_back shared_back iterations; do : >"${work}/${f}"; done
local_used=0; fetched=0
for ((i = 1; i <= runs; i++)); do
  mode=${modes[$(((i - 1) % ${#modes[@]}))]}
  victim=$((RANDOM % 4))
  # Rank 0 alone writes the metadata, renames and commits.
  case "${mode}" in save:metadata_written | save:renaming | save:committed) victim=0 ;; esac
  dir="${work}/run${i}"
  mkdir -p "${dir}"
  env_extra=()
  if [[ "${mode}" == save:* ]]; then
    env_extra=(MCC_CHAOS_KILL_AT_SAVE="${mode#save:}" MCC_CHAOS_KILL_RANK="${victim}")
  fi
  env MCC_CHAOS_RUN="${i}" "${env_extra[@]}" "${launch}" --nproc_per_node 4 --grace-period-s 5 \
    --rank-exit-timeout-s 10 -- \
    "${train}" "${common[@]}" --save "${dir}/ckpt" --save-interval 3 --async-save \
    "${local_flags[@]}" --non-persistent-local-ckpt-dir "${dir}/local" \
    --flight-recorder-dir "${dir}/fr" \
    --metrics-file "${dir}/killed.jsonl" >"${dir}/killed.log" 2>&1 &
  launcher=$!
  victim_pid=""
  for _ in $(seq 1 100); do
    victim_pid=$(rank_pid "${launcher}" "${victim}")
    [[ -n "${victim_pid}" ]] && break
    sleep 0.05
  done
  died="" timed=""
  if [[ "${mode}" == time || "${mode}" == stop || "${mode}" == term ]]; then
    delay=$(awk -v r="${RANDOM}" -v d="${ref_seconds}" 'BEGIN { printf "%.2f", 0.3 + (d * 0.7) * r / 32768 }')
    sleep "${delay}"
    case "${mode}" in
      time) [[ -n "${victim_pid}" ]] && kill -KILL "${victim_pid}" 2>/dev/null ;;
      stop) [[ -n "${victim_pid}" ]] && kill -STOP "${victim_pid}" 2>/dev/null ;;
      term) kill -TERM "${launcher}" 2>/dev/null ;;
    esac
    [[ -n "${victim_pid}" || "${mode}" == term ]] && died=$(now)
    what="${mode} ${delay}s"
  else
    what="${mode}"
  fi
  # Wait for the fault (a death by the hook), then up to 30 s for the
  # launcher.
  while kill -0 "${launcher}" 2>/dev/null; do
    if [[ -z "${died}" && -n "${victim_pid}" ]] && ! kill -0 "${victim_pid}" 2>/dev/null; then died=$(now); fi
    if [[ -n "${died}" ]] && awk -v a="${died}" -v b="$(now)" 'BEGIN { exit !(b - a > 30) }'; then break; fi
    sleep 0.05
  done
  if kill -0 "${launcher}" 2>/dev/null; then
    hangs=$((hangs + 1))
    echo "run ${i} (${what}, rank ${victim}): HANG: the job did not end within 30 s of the death"
    kill -KILL "${launcher}" $(job_pids "${i}") 2>/dev/null
  fi
  wait "${launcher}" 2>/dev/null
  code=$?
  ended=$(now)
  echo "run ${i}: kill rank ${victim} at ${what}: job exit code ${code}"
  if [[ "${mode}" == term ]]; then
    # SIGTERM: every rank finishes its step, saves and exits 0, or the run
    # had ended; either way the job's code is 0 and a checkpoint is there.
    if [[ "${code}" != 0 ]] || [[ ! -f "${dir}/ckpt/latest_checkpointed_iteration.txt" ]]; then
      unsaved=$((unsaved + 1))
      echo "run ${i} (${what}): SIGTERM did not end in a save and exit 0"
      tail -5 "${dir}/killed.log"
    elif grep -q "SIGTERM received" "${dir}/killed.log"; then
      count_fault
    else
      no_fault=$((no_fault + 1))
    fi
  elif [[ "${code}" == 0 ]]; then
    no_fault=$((no_fault + 1))  # The fault came after the end, or the event never fired.
  elif [[ "${mode}" == stop ]]; then
    count_fault
    # Stopped mid-job, the others' dumps name it; stopped after the job's
    # last collective, the launcher does (--rank-exit-timeout-s). The report
    # is read whole: under pipefail a writer into "grep -q" can die of
    # SIGPIPE once grep has matched.
    hang_report=$("${analyze_hang}" "${dir}/fr" 2>&1)
    # Stopped before the first collective (no dumps name it), the launcher
    # names it when it kills the job.
    if ! grep -q "rank ${victim}\b.*left no dump" <<<"${hang_report}" &&
       ! grep -q "rank ${victim} (pid [0-9]*) is still running" "${dir}/killed.log" &&
       ! grep -q "rank ${victim} (pid [0-9]*) is stopped" "${dir}/killed.log"; then
      unnamed=$((unnamed + 1))
      echo "run ${i} (${what}, rank ${victim}): analyze_hang did not name the stopped rank"
      tail -3 <<<"${hang_report}"
    fi
  else
    count_fault
    if ! grep -q "rank ${victim} (pid [0-9]*) exited with code 137" "${dir}/killed.log"; then
      unnamed=$((unnamed + 1))
      echo "run ${i} (${what}, rank ${victim}): the launcher did not name the dead rank"
    fi
  fi
  sleep 0.2
  left=$(job_pids "${i}")
  if [[ -n "${left}" ]]; then
    leftovers=$((leftovers + 1))
    echo "run ${i} (${what}): processes left behind: ${left}"
    kill -KILL ${left} 2>/dev/null
  fi
  # Resume from whatever `latest` names, as tools/launch --max-restarts
  # would: --load equal to --save, so a run killed before its first save
  # starts from scratch, and a killed save's leftovers are repaired. Twice:
  # from a copy of the shared directory alone, then with the local
  # checkpoints too.
  reached=$(losses "${dir}/killed.jsonl" 2>/dev/null | tail -1 | cut -d' ' -f1)
  reached=${reached:-0}
  rm -rf "${dir}/shared" && mkdir -p "${dir}/ckpt" && cp -a "${dir}/ckpt" "${dir}/shared"
  resume_timed "${dir}/resumed_shared" --load "${dir}/shared" --save "${dir}/shared"
  check_history "${dir}/resumed_shared" "from the shared directory"
  shared_first=${first_s} shared_back=${back_s}
  # Every other run the victim's node is replaced: its local directory is
  # gone, and its copies come back from its peer.
  ((i % 2 == 0)) && rm -rf "${dir}/local/rank_0000${victim}"
  resume_timed "${dir}/resumed" --load "${dir}/ckpt" --save "${dir}/ckpt" \
    "${local_flags[@]}" --non-persistent-local-ckpt-dir "${dir}/local"
  check_history "${dir}/resumed" "with local checkpoints"
  grep -q "resuming from local checkpoints" "${dir}/resumed.log" && local_used=$((local_used + 1))
  grep -q "fetched local checkpoint" "${dir}/resumed.log" && fetched=$((fetched + 1))
  if [[ -n "${timed}" ]]; then
    fault_s=$(awk -v a="${died}" -v b="${ended}" 'BEGIN { printf "%.2f", b - a }')
    for pair in "local_first ${first_s}" "shared_first ${shared_first}" \
                "local_back ${back_s}" "shared_back ${shared_back}"; do
      set -- ${pair}
      awk -v f="${fault_s}" -v s="$2" 'BEGIN { printf "%.2f\n", f + s }' >>"${work}/$1"
    done
    # The iterations each resumed from (0: from scratch) and had reached.
    echo "${reached} $(first_iteration "${dir}/resumed_shared.jsonl") $(first_iteration "${dir}/resumed.jsonl")" >>"${work}/iterations"
  fi
  rm -rf "${dir}/ckpt" "${dir}/shared" "${dir}/local"
done

p50=$(sort -g "${work}/death_to_exit" | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "n/a" }')
max=$(sort -g "${work}/death_to_exit" | tail -1)
echo
echo "chaos: ${runs} runs, ${faults} with a rank killed (by mode: $(for m in "${!count[@]}"; do printf '%s %s, ' "${m}" "${count[${m}]}"; done | sed 's/, $//')), ${no_fault} ended before the kill"
echo "hangs ${hangs}, dead or stopped rank not named ${unnamed}, SIGTERM without a save and exit 0 ${unsaved}, processes left behind ${leftovers}, corrupted checkpoints ${corrupted}, bit-exact resumes ${exact} of $((2 * runs)) (mismatched ${mismatched})"
echo "fault to job exit: p50 ${p50} s, max ${max:-n/a} s"
echo "resumes with local checkpoints: ${local_used} of ${runs} from the local copies (${fetched} with a rank's copy fetched from its peer), the rest from the shared directory"
awk '$2 != "" && $3 != "" { n++; lost_s += $1 - $2; lost_l += $1 - $3 }
     END { if (n) printf "iterations lost per fault (reached minus resumed from): local %.2f, shared %.2f (%d faults)\n", lost_l / n, lost_s / n, n }' "${work}/iterations"
echo "fault to resumed training (first iteration): local $(summary "${work}/local_first"); shared $(summary "${work}/shared_first")"
echo "fault to regained progress (the faulted run's iteration): local $(summary "${work}/local_back"); shared $(summary "${work}/shared_back")"
[[ $((hangs + unnamed + unsaved + leftovers + corrupted + mismatched)) == 0 ]]
