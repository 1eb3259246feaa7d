#!/usr/bin/env bash
# Gathers the prebuilt GPU test binaries and the CUDA bench, with the shared
# libraries the GPU machine lacks, into one folder to carry to a GPU machine
# that has no Bazel (see tools/gpu/run_checks.sh). Users run
# tools/gpu/make_bundle.sh, which builds the binaries, calls this, checks
# the result (tools/gpu/check_bundle.sh) and packs it.
#
#   tools/gpu/collect_libs.sh [--with-cuda] DEST [BINARY...]
#
# BINARYs default to the gpu-tagged tests, the bench, the train binary and
# the launcher (tools/gpu/check_multi_rank.sh starts its ranks with it)
# under bazel-out/k8-opt/bin (COLLECT_BIN_ROOT overrides it; tests point it
# at their runfiles). With train (or train_testdev) comes the data its GPU
# checks train on (tools/gpu/check_train_parity.sh, check_multi_rank.sh;
# the throughput check uses mock data): the default corpus, tokenized here
# into DEST/data/default_corpus_text_document.{bin,idx} (about 3 MB), since
# the GPU machine need not have the Debian packages it comes from.
# Binaries land in DEST/bin/<package path>/, libraries in DEST/lib/. Left
# behind (tools/gpu/device_libs.txt lists them): the C runtime (libc, libm,
# ld-linux, ...) and the NVIDIA driver (libcuda), which the GPU machine
# has, and NCCL, cuBLAS/cuBLASLt and cuDNN (hundreds of MB), which resolve
# there from LD_LIBRARY_PATH, /usr/local/cuda/lib64 or the PyTorch
# environment's nvidia wheels (check_lib.sh's gpu_library_path). The CUDA
# runtime (libcudart, 0.7 MB) is carried. --with-cuda carries the CUDA
# libraries too (about 780 MB: too big for the device tool).
set -euo pipefail

with_cuda=0
if [[ "${1:-}" == "--with-cuda" ]]; then
  with_cuda=1
  shift
fi
if [[ $# -lt 1 ]]; then
  echo "usage: $0 [--with-cuda] DEST [BINARY...]" >&2
  exit 2
fi
dest="$1"
shift
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin_root="${COLLECT_BIN_ROOT:-${root}/bazel-out/k8-opt/bin}"
binaries=("$@")
if [[ ${#binaries[@]} -eq 0 ]]; then
  binaries=(
    "${bin_root}/core/cuda/runtime_test"
    "${bin_root}/core/cuda/staging_test"
    "${bin_root}/core/cuda/activation_offload_test"
    "${bin_root}/core/cuda/runtime_nodevice_test"
    "${bin_root}/core/ops/cuda/registrations_test"
    "${bin_root}/core/ops/cuda/gemm_test"
    "${bin_root}/core/ops/cuda/flash_attention_test"
    "${bin_root}/core/ops/cuda/cached_attention_test"
    "${bin_root}/core/ops/cuda/paged_attention_test"
    "${bin_root}/parallel/context_parallel/softmax_merge_cuda_test"
    "${bin_root}/core/ops/cuda/int8_test"
    "${bin_root}/core/ops/cuda/fp8_test"
    "${bin_root}/core/ops/cuda/fp8_weight_test"
    "${bin_root}/core/ops/cuda/index_check_loss_totals_test"
    "${bin_root}/core/ops/cuda/graph_capture_test"
    "${bin_root}/core/ops/cuda/moe_test"
    "${bin_root}/core/ops/cuda/slot_coverage_test"
    "${bin_root}/core/ops/cuda/registrations_nodevice_test"
    "${bin_root}/core/comm/nccl_process_group_test"
    "${bin_root}/core/ops/cuda/bench"
    "${bin_root}/core/ops/cuda/grouped_gemm_bench"
    "${bin_root}/tools/train"
    "${bin_root}/tools/launch"
    "${bin_root}/tools/serve/serve"
  )
fi

mkdir -p "${dest}/bin" "${dest}/lib"
declare -A copied=()
for binary in "${binaries[@]}"; do
  if [[ ! -x "${binary}" ]]; then
    echo "collect_libs: missing binary ${binary} (build it first)" >&2
    exit 1
  fi
  rel="${binary#"${bin_root}/"}"
  mkdir -p "${dest}/bin/$(dirname "${rel}")"
  cp -L "${binary}" "${dest}/bin/${rel}"
  # ldd lines: "libfoo.so.1 => /path/libfoo.so.1 (0x...)".
  while read -r name arrow path _; do
    [[ "${arrow}" == "=>" && -f "${path}" ]] || continue
    case "${name}" in
      linux-vdso* | ld-linux* | libc.so* | libm.so* | libdl.so* | libpthread.so* | \
        librt.so* | libcuda.so* | libnvidia*) continue ;;
      libcublas* | libnccl* | libcudnn* | libnvJitLink*) ((with_cuda)) || continue ;;
    esac
    if [[ -z "${copied[${name}]:-}" ]]; then
      cp -L "${path}" "${dest}/lib/${name}"
      copied[${name}]=1
    fi
  done < <(ldd "${binary}")
done
# cuBLAS is loaded with dlopen (core/ops/cuda/cublas_library.h), so ldd does
# not list it; with --with-cuda carry it anyway (LD_LIBRARY_PATH finds it).
if ((with_cuda)); then
  for path in /usr/local/cuda/lib64/libcublasLt.so.[0-9]* \
    /usr/local/cuda/lib64/libcublas.so.[0-9]*; do
    name="$(basename "${path}")"
    [[ "${name}" =~ ^libcublas(Lt)?\.so\.[0-9]+$ ]] || continue
    cp -L "${path}" "${dest}/lib/${name}"
    copied[${name}]=1
  done
fi
# The train binary's data: it writes the default corpus under
# ./runs/default/data when it has neither --data-path nor --mock-data.
for binary in "${binaries[@]}"; do
  [[ "${binary}" == */tools/train || "${binary}" == */tools/train_testdev ]] || continue
  corpus_dir="$(mktemp -d)"
  train="$(cd "$(dirname "${binary}")" && pwd)/$(basename "${binary}")"
  if ! (cd "${corpus_dir}" && "${train}" --device cpu --train-iters 1 \
    --eval-iters 0 --peak-tflops 1 >train.log 2>&1); then
    echo "collect_libs: ${binary} could not write the default corpus:" >&2
    tail -5 "${corpus_dir}/train.log" >&2
    exit 1
  fi
  mkdir -p "${dest}/data"
  cp "${corpus_dir}"/runs/default/data/default_corpus_text_document.{bin,idx} \
    "${dest}/data/"
  rm -rf "${corpus_dir}"
done
echo "collect_libs: ${#binaries[@]} binaries, ${#copied[@]} libraries into ${dest}" \
  "($(du -sh "${dest}" | cut -f1))"
