#!/bin/bash
# moe_dispatch_bench at EP 2 on tiny shapes, once: each rank exits non-zero
# (and the bench with it) when the replayed Dispatch differs from the rows
# the layer dispatched or Combine does not bring them back bit for bit.
# Times nothing.
set -euo pipefail
out="${TEST_TMPDIR:-/tmp}/bench.txt"
"$1" --ep 2 --reps 1 --tokens 64 --hidden 32 --experts 4 --ffn 16 > "${out}"
grep -q "^2  fp32 alltoall" "${out}"
grep -q "^2  bf16 allgather" "${out}"
