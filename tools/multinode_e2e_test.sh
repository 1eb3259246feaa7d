#!/usr/bin/env bash
# End to end, in real processes: a job of two "nodes" on this machine, as
# users start one. TP 2 x DP 2 trained by
#  - one launcher with 4 local ranks (the reference);
#  - two launchers, --nnodes 2 --node_rank 0/1 --master_addr 127.0.0.1, each
#    with 2 local ranks, sharing a job secret (--rdzv-secret-file);
#  - 4 ranks started the way SLURM's srun starts them (SLURM_PROCID,
#    SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS_PER_NODE,
#    MASTER_ADDR/MASTER_PORT, the secret in MCC_JOB_SECRET_FILE), with no
#    launcher.
# The ranks, groups and reduction orders are the same in all three, so the
# losses must be bit-identical. Every run is bounded by `timeout`, so a rank
# that never finds its peers fails the test instead of hanging it.
set -euo pipefail
launch=$1
train=$2
source "$3"
work=${TEST_TMPDIR:-$(mktemp -d)}
common=(--mock-data --vocab-size 512 --num-layers 2 --hidden-size 64
        --num-attention-heads 4 --seq-length 64 --micro-batch-size 2
        --global-batch-size 8 --eval-iters 0 --log-interval 1
        --train-iters 6 --lr-decay-iters 6 --num-threads 1
        --tensor-model-parallel-size 2 --sequence-parallel)
limit=240  # seconds per run; a run takes about 10 s on 2 loaded cores

# A port nobody listens on now, below the kernel's ephemeral range (as
# FindFreePort picks): no outgoing connection can take it before the store
# listens on it.
free_port() {
  python3 -c '
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(64):
    port = random.randrange(max(1024, low // 2), low) if low > 2048 else 0
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port)); print(s.getsockname()[1]); break
    except OSError:
        pass
    finally:
        s.close()
'
}

# Waits for the given pids; fails (printing the logs) if any failed.
wait_all() {
  local name=$1 failed=0 pid
  shift
  for pid in "$@"; do wait "$pid" || failed=1; done
  if ((failed)); then
    echo "$name failed (or ran past ${limit}s):"
    cat "$work/$name".*log
    exit 1
  fi
}

run reference 4

# The job's secret, one file that every node reads.
secret_file=$work/job.secret
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$secret_file"
chmod 600 "$secret_file"

# Two launchers, one per node, 2 local ranks each; node 0's rank 0 serves
# the rendezvous store on the master port.
port=$(free_port)
pids=()
for node in 0 1; do
  timeout "$limit" "$launch" --nnodes 2 --node_rank "$node" --nproc_per_node 2 \
    --master_addr 127.0.0.1 --master_port "$port" --rdzv_id multinode \
    --rdzv-secret-file "$secret_file" -- \
    "$train" "${common[@]}" --metrics-file "$work/two_launchers.jsonl" \
    > "$work/two_launchers.node$node.log" 2>&1 &
  pids+=($!)
done
wait_all two_launchers "${pids[@]}"
# The store required the secret (it logs when it runs without one).
if grep -q unauthenticated "$work"/two_launchers.node*.log; then
  echo "the two launchers' store ran unauthenticated"; exit 1
fi
diff <(losses "$work/reference.jsonl") <(losses "$work/two_launchers.jsonl")
[[ $(losses "$work/two_launchers.jsonl" | wc -l) == 6 ]]

# srun's environment: 2 nodes x 2 tasks, no launcher.
port=$(free_port)
pids=()
for rank in 0 1 2 3; do
  env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE \
    SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_PROCID=$rank SLURM_NTASKS=4 SLURM_LOCALID=$((rank % 2)) \
    SLURM_NODEID=$((rank / 2)) SLURM_NTASKS_PER_NODE=2 SLURM_NNODES=2 \
    SLURM_TASKS_PER_NODE='2(x2)' SLURM_JOB_NODELIST='node[0-1]' \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port MCC_JOB_SECRET_FILE=$secret_file \
    timeout "$limit" "$train" "${common[@]}" --metrics-file "$work/slurm.jsonl" \
    > "$work/slurm.rank$rank.log" 2>&1 &
  pids+=($!)
done
wait_all slurm "${pids[@]}"
if grep -q unauthenticated "$work"/slurm.rank*.log; then
  echo "the srun-style ranks' store ran unauthenticated"; exit 1
fi
diff <(losses "$work/reference.jsonl") <(losses "$work/slurm.jsonl")
[[ $(losses "$work/slurm.jsonl" | wc -l) == 6 ]]
echo "multi-node: two launchers and srun-style ranks match one launcher exactly"
