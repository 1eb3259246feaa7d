#!/usr/bin/env bash
# Trains TinyLm serially and in every layout on 2 processes (started by
# megatron_cpp's launcher) and checks each against the serial run.
set -uo pipefail
train=$1
launch=$2
compare=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}

"${train}" --layout serial --out "${tmp}/serial" || exit 1
failed=0
for layout in dp2 dp2_zero3 pp2 pp2_interleaved pp2_zb_h1; do
  if ! timeout 120 "${launch}" --nproc_per_node 2 -- "${train}" \
      --layout "${layout}" --out "${tmp}/${layout}"; then
    echo "FAIL: ${layout}: the launched run failed"
    failed=1
    continue
  fi
  echo -n "${layout}: "
  python3 "${compare}" "${tmp}/serial.0" "${tmp}/${layout}.0" "${tmp}/${layout}.1" || failed=1
done
exit ${failed}
