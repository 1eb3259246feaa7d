#!/bin/bash
# moe_layer_bench on tiny shapes, once: it exits non-zero when a grouped GEMM
# differs from a dense GEMM per expert, or the one-expert MoE layer from its
# dense MLP reference (forward, input and weight gradients). Times nothing.
set -euo pipefail
"$1" --reps 1 --profile=false --gemms 4x64x32x48 --layers 4x2x16 \
  --tokens 64 --hidden 32 > "${TEST_TMPDIR:-/tmp}/bench.txt"
grep -q "E4 top-2 f16" "${TEST_TMPDIR:-/tmp}/bench.txt"
