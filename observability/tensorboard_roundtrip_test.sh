#!/usr/bin/env bash
# Writes scalars with the project's writer and reads them back with an
# independent Python reader (Debian's python3-protobuf and python3-crc32c).
set -euo pipefail
writer="$1"
reader="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}/tb"
scalars=(
  "lm loss=3.25@1" "lm loss=2.875@2" "learning-rate=0.0003@2"
  "grad-norm=1.5e-3@2" "loss-scale=65536@2" "throughput/tokens per second=1234.5@2"
  "lm loss validation/ppl=17.5@2" "negative=-0.1@7" "big step=1@1099511627776"
)
path="$("${writer}" "${dir}" "${scalars[@]}")"
/usr/bin/python3 "${reader}" "${path}" "${scalars[@]}"
# The reader must notice a corrupted byte.
cp "${path}" "${dir}/corrupt"
printf '\xff' | dd of="${dir}/corrupt" bs=1 seek=40 conv=notrunc 2>/dev/null
if /usr/bin/python3 "${reader}" "${dir}/corrupt" "${scalars[@]}" 2>/dev/null; then
  echo "the reader accepted a corrupted file" >&2
  exit 1
fi
echo PASS
