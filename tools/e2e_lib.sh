# Shared by the train end-to-end tests (sourced; not run on its own).
# The sourcing script sets: launch, train (binaries), work (a directory) and
# the array common (flags every run takes).

# "iteration loss" lines of a --metrics-file.
losses() { sed -n 's/.*"iteration": \([0-9]*\),.*"loss": \([^,]*\),.*/\1 \2/p' "$1"; }

# The first logged iteration of a --metrics-file.
first_iteration() { losses "$1" | head -1 | cut -d' ' -f1; }

# Compares the losses of two metrics files at their common iterations within
# a relative tolerance; prints the iterations that differ, fails on any.
compare() {
  local tol=$3
  awk -v tol="$tol" -v a="$1" -v b="$2" '
    NR == FNR { ref[$1] = $2; next }
    ($1 in ref) { d = ref[$1] - $2; if (d < 0) d = -d; m = ref[$1] < 0 ? -ref[$1] : ref[$1];
      n++; if (d > tol * m) { printf "iteration %d: %s %s vs %s %s\n", $1, a, ref[$1], b, $2; bad++ } }
    END { if (n == 0) { print "no common iterations"; exit 1 } if (bad) exit 1 }' \
    <(losses "$1") <(losses "$2")
}

# run NAME NPROC FLAGS...: trains with common + FLAGS in NPROC processes
# (one: without the launcher), writing $work/NAME.jsonl and NAME.log; on
# failure prints the log and exits. --peak-tflops 1 (common or FLAGS may
# give another): no GEMM peak probe, which holds every run's start for over
# half a second; only MFU depends on it.
run() {
  local name=$1 nproc=$2
  shift 2
  if [[ $nproc == 1 ]]; then
    "$train" --peak-tflops 1 "${common[@]}" "$@" \
      --metrics-file "$work/$name.jsonl" > "$work/$name.log" 2>&1 \
      || { cat "$work/$name.log"; exit 1; }
  else
    "$launch" --nproc_per_node "$nproc" -- "$train" --peak-tflops 1 \
      "${common[@]}" "$@" --metrics-file "$work/$name.jsonl" \
      > "$work/$name.log" 2>&1 || { cat "$work/$name.log"; exit 1; }
  fi
}

# The tiny mock-data GPT of the resilience tests (early exits, a stopped
# rank, the rerun check): 2 layers, hidden 32, a log line every iteration.
tiny_gpt=(--mock-data --vocab-size 256 --num-layers 2 --hidden-size 32
          --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
          --global-batch-size 8 --eval-iters 0 --log-interval 1 --num-threads 1)

# wait_for_iterations FILE N: waits (up to 60 s) until the --metrics-file
# FILE has logged N iterations.
wait_for_iterations() {
  for _ in $(seq 600); do
    [[ -f "$1" ]] && [[ "$(losses "$1" | wc -l)" -ge "$2" ]] && return 0
    sleep 0.1
  done
  return 1
}

# The tiny MoE GPT of the MoE end-to-end tests (top-2 over --num-experts,
# given by the test with --moe-layer-freq; a shared expert, aux and z
# losses, the expert bias), 20 iterations.
tiny_moe_flags=(--mock-data --vocab-size 64 --num-layers 2 --hidden-size 32
  --num-attention-heads 4 --seq-length 32 --micro-batch-size 2
  --global-batch-size 8 --eval-iters 0 --log-interval 5
  --train-iters 20 --lr 1e-2 --lr-decay-iters 20 --num-threads 1
  --disable-bias-linear --swiglu --moe-router-topk 2
  --moe-ffn-hidden-size 32 --moe-shared-expert-intermediate-size 16
  --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3
  --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-2)

# The largest relative loss difference of two metrics files (for the log).
worst() {
  awk 'NR == FNR { ref[$1] = $2; next }
    ($1 in ref) { d = (ref[$1] - $2) / ref[$1]; if (d < 0) d = -d; if (d > m) m = d }
    END { printf "%.3g\n", m }' <(losses "$1") <(losses "$2")
}
