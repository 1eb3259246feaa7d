#!/usr/bin/env bash
# Checks that a GPU bundle (tools/gpu/collect_libs.sh's folder) can start on
# the GPU machine and travel there:
# - every library that a carried ELF file (DEST/bin/**, DEST/lib/*) needs
#   (readelf's DT_NEEDED) is carried in DEST/lib or listed in
#   tools/gpu/device_libs.txt (the C runtime, the driver, the PyTorch
#   environment's NCCL, cuBLAS and cuDNN wheels);
# - the packed bundle (TARBALL, when given) plus TREE_BYTES (the working tree
#   that travels beside it; make_bundle.sh measures it with git) fits in
#   GPU_BUNDLE_BUDGET_MIB (default 48 MiB; the device tool carries 64).
# Prints what it found, then "BUNDLE: ok (...)" or "BUNDLE: FAILED (...)".
#
#   tools/gpu/check_bundle.sh DEST [TARBALL [TREE_BYTES]]
set -uo pipefail
dest="$1"
tarball="${2:-}"
tree_bytes="${3:-0}"
budget_mib="${GPU_BUNDLE_BUDGET_MIB:-48}"
allowed_file="$(dirname "$0")/device_libs.txt"

declare -A allowed=() carried=()
while read -r name _; do
  [[ -z "${name}" || "${name}" == \#* ]] || allowed[${name}]=1
done <"${allowed_file}"
for f in "${dest}"/lib/*; do
  [[ -e "${f}" ]] && carried[$(basename "${f}")]=1
done

problems=()
n_elf=0
while read -r f; do
  # Only ELF files: the bundle may hold scripts and data.
  [[ "$(head -c 4 "${f}" | od -An -c | tr -d ' ')" == "177ELF" ]] || continue
  n_elf=$((n_elf + 1))
  while read -r needed; do
    [[ -n "${carried[${needed}]:-}" || -n "${allowed[${needed}]:-}" ]] && continue
    problems+=("${f#"${dest}/"} needs ${needed}, neither carried nor on the GPU machine")
  done < <(readelf -d "${f}" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
done < <(find -L "${dest}/bin" "${dest}/lib" -type f 2>/dev/null | sort)
((n_elf > 0)) || problems+=("no binaries under ${dest}/bin")

size_note=""
if [[ -n "${tarball}" ]]; then
  packed=$(stat -L -c %s "${tarball}")
  total=$((packed + tree_bytes))
  size_note="; ${tarball##*/} $((packed / 1048576)) MiB + tree $((tree_bytes / 1048576)) MiB = $((total / 1048576)) MiB of ${budget_mib}"
  if ((total > budget_mib * 1048576)); then
    problems+=("packed bundle (${packed} bytes) plus the working tree (${tree_bytes} bytes) exceed ${budget_mib} MiB")
  fi
fi

for p in "${problems[@]}"; do echo "  ${p}"; done
if ((${#problems[@]})); then
  echo "BUNDLE: FAILED (${#problems[@]} problems${size_note})"
  exit 1
fi
echo "BUNDLE: ok (${n_elf} ELF files, ${#carried[@]} libraries carried, every DT_NEEDED carried or on the GPU machine${size_note})"
