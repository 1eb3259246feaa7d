#!/usr/bin/env bash
# The MoE variant of TinyLm (each block a mixture of 4 experts, top-2, with
# the balancing loss; @megatron_cpp//models/moe's layer): the serial loss
# falls by a quarter in 20 steps (3.66 -> 2.34 when written; the dense
# blocks reach 1.23), and DP 2, ZeRO-3 and PP 2 on 2 real processes equal the serial run
# (losses and every parameter, compare_runs.py's bound).
set -uo pipefail
train=$1
launch=$2
compare=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
moe=(--num_experts 4 --steps 20)

"${train}" "${moe[@]}" --layout serial --out "${tmp}/serial" || exit 1
first=$(awk '$1 == "loss" && $2 == 0 { print $3 }' "${tmp}/serial.0")
last=$(awk '$1 == "loss" { v = $3 } END { print v }' "${tmp}/serial.0")
echo "serial loss ${first} -> ${last}"
awk -v a="${first}" -v b="${last}" 'BEGIN { exit !(b < 0.75 * a) }' \
  || { echo "FAIL: the MoE model's loss did not fall by 25% in 20 steps"; exit 1; }
grep -q "^param blocks.0.moe.experts.linear_fc1.weight " "${tmp}/serial.0" \
  || { echo "FAIL: no expert weights in the serial run"; exit 1; }
failed=0
for layout in dp2 dp2_zero3 pp2; do
  if ! timeout 120 "${launch}" --nproc_per_node 2 -- "${train}" "${moe[@]}" \
      --layout "${layout}" --out "${tmp}/${layout}"; then
    echo "FAIL: ${layout}: the launched run failed"
    failed=1
    continue
  fi
  echo -n "${layout}: "
  python3 "${compare}" "${tmp}/serial.0" "${tmp}/${layout}.0" "${tmp}/${layout}.1" || failed=1
done
exit ${failed}
