#!/usr/bin/env bash
# The first seconds of a GPU run (tools/gpu/run_checks.sh runs it first; it
# ends in well under 10 s): what the machine is and whether the bundle can
# start there, before any test spends time.
# - nvidia-smi: the GPU, its driver version and memory (or that there is
#   none);
# - every shared library each bundled binary needs (ldd), with the file it
#   resolves to under the search path of check_lib.sh's gpu_library_path
#   (the bundle's lib/, LD_LIBRARY_PATH, /usr/local/cuda/lib64, the PyTorch
#   environment's nvidia wheels), the CUDA runtime's among them, and the
#   libraries loaded with dlopen (cuBLAS, cuBLASLt);
# - with --expect-gpu: that the CUDA runtime sees the GPU (a probe test
#   under MCC_EXPECT_CUDA=1, which dies naming cudaGetDeviceCount's error).
# Ends with one line, and exit status 0 only when it is ok:
#   PREFLIGHT: ok (18 binaries, 31 libraries resolved; GPU: NVIDIA H200, driver 580.159.04)
#   PREFLIGHT: FAILED (missing libnccl.so.2 (tools/train, ...))
#
#   tools/gpu/preflight.sh [--expect-gpu] DIR
set -uo pipefail
source "$(dirname "$0")/check_lib.sh"

expect_gpu=0
dir=""
for arg in "$@"; do
  case "${arg}" in
    --expect-gpu) expect_gpu=1 ;;
    *) dir="${arg}" ;;
  esac
done
bundle_paths "${dir:-gpu_bundle}"

gpu="none"
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi
  gpu="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader |
    head -1 | sed 's/, */, driver /')"
else
  echo "nvidia-smi: $(command -v nvidia-smi >/dev/null && echo "sees no GPU" || echo "not installed")"
fi
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH}"

declare -A resolved=() missing=()
n_bin=0
while read -r exe; do
  n_bin=$((n_bin + 1))
  rel="${exe#"${bin}/"}"
  while read -r line; do
    # A library too old for what was linked here (built on Debian 12,
    # glibc 2.36): "...: version `GLIBC_2.36' not found (required by ...)".
    if [[ "${line}" == *"version \`"*"' not found"* ]]; then
      version="$(sed -n "s/.*version \`\([^']*\)' not found.*/\1/p" <<<"${line}")"
      version="${version:-a symbol version} (the machine's library is older)"
      missing[${version}]+="${missing[${version}]:+, }${rel}"
      continue
    fi
    read -r name arrow path _ <<<"${line}"
    [[ "${arrow}" == "=>" ]] || continue
    if [[ "${path}" == not ]]; then
      missing[${name}]+="${missing[${name}]:+, }${rel}"
    else
      resolved[${name}]="${path}"
    fi
  done < <(ldd "${exe}" 2>&1)
done < <(find -L "${bin}" -type f -perm -u+x | sort)

# dlopen'd: found the way the loader would (the search path, then ldconfig).
for name in libcublas.so.13 libcublasLt.so.13; do
  path=""
  IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH}"
  for d in "${dirs[@]}"; do
    [[ -n "${d}" && -e "${d}/${name}" ]] && { path="${d}/${name}"; break; }
  done
  [[ -z "${path}" ]] && path="$(ldconfig -p 2>/dev/null | awk -v n="${name}" '$1 == n { print $NF; exit }')"
  if [[ -n "${path}" ]]; then
    resolved[${name}]="${path} (dlopen)"
    # What it needs in turn must resolve too.
    while read -r dep arrow where _; do
      [[ "${arrow}" == "=>" && "${where}" == not ]] &&
        missing[${dep}]+="${missing[${dep}]:+, }${name}"
    done < <(ldd "${path}" 2>/dev/null)
  else
    missing[${name}]="loaded with dlopen by the GEMMs"
  fi
done

while read -r name; do
  [[ -n "${name}" ]] && printf '  %-28s %s\n' "${name}" "${resolved[${name}]}"
done < <(printf '%s\n' "${!resolved[@]}" | sort)
cudart="${resolved[libcudart.so.13]:-}"
runtime="${cudart:+$(basename "$(readlink -f "${cudart}")")}"
echo "CUDA runtime: ${runtime:-not linked}; GPU: ${gpu}"

if ((${#missing[@]})); then
  while IFS= read -r name; do
    echo "  MISSING ${name}: ${missing[${name}]}"
  done < <(printf '%s\n' "${!missing[@]}" | sort)
  echo "PREFLIGHT: FAILED (missing $(printf '%s\n' "${!missing[@]}" | sort | paste -sd, - | sed 's/,/, /g'))"
  exit 1
fi

if ((expect_gpu)); then
  probe="${bin}/core/cuda/runtime_nodevice_test"
  if [[ ! -x "${probe}" ]]; then
    echo "PREFLIGHT: FAILED (GPU expected; the probe ${probe} is missing)"
    exit 1
  fi
  out="$(MCC_EXPECT_CUDA=1 timeout -k 2 20 "${probe}" \
    --gtest_filter='NoDeviceReasonTest.*' 2>&1)"
  if [[ $? -ne 0 ]]; then
    echo "${out}" | grep -E 'MCC_EXPECT_CUDA|Check failed|error' | head -5
    echo "PREFLIGHT: FAILED (GPU expected but the CUDA runtime sees none:" \
      "$(echo "${out}" | sed -n 's/.*no CUDA device is usable: //p' | head -1))"
    exit 1
  fi
fi
echo "PREFLIGHT: ok (${n_bin} binaries, ${#resolved[@]} libraries resolved; GPU: ${gpu})"
