#!/usr/bin/env bash
# The one command that makes the GPU machine's bundle (see README, "On a GPU
# machine"): builds the GPU test binaries, the CUDA bench, train and launch;
# gathers them with the libraries the GPU machine lacks
# (tools/gpu/collect_libs.sh); checks that every library they need is
# carried or on the GPU machine and that the packed bundle plus the working
# tree fit the budget (tools/gpu/check_bundle.sh, 48 MiB of the device
# tool's 64); packs DEST.tar.xz (git-ignored: carry it).
#
#   tools/gpu/make_bundle.sh [DEST]      # default gpu_bundle
#
# There: tools/gpu/run_checks.sh DEST (unpacks DEST.tar.xz; results under
# $OUT).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="${1:-gpu_bundle}"
[[ "${dest}" == /* ]] || dest="${PWD}/${dest}"

(cd "${root}" && tools/bazel build //core/cuda/... //core/ops/cuda/... \
  //core/comm:nccl_process_group_test \
  //parallel/context_parallel:softmax_merge_cuda_test //tools:train //tools:launch \
  //tools/serve:serve)
rm -rf "${dest}" "${dest}.tar.xz"
"${root}/tools/gpu/collect_libs.sh" "${dest}"
# A dictionary as large as the bundle: train, serve and two benches each
# link the CUDA kernels' 8.8 MB fatbin statically, beside the kernels'
# shared library; xz's default 8 MiB window packed each copy again (29 MiB;
# 19 MiB with the window; decompressing needs 192 MiB of memory there).
XZ_OPT="${XZ_OPT:--T0 --lzma2=preset=6,dict=192MiB}" tar -cJf "${dest}.tar.xz" -C "$(dirname "${dest}")" "$(basename "${dest}")"
# What travels beside the tarball: tracked and untracked, not ignored files.
tree_bytes=$(cd "${root}" && git ls-files -z --cached --others --exclude-standard |
  xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
"${root}/tools/gpu/check_bundle.sh" "${dest}" "${dest}.tar.xz" "${tree_bytes}"
echo "make_bundle: ${dest}.tar.xz; carry it and run there:"
echo "  tools/gpu/run_checks.sh $(basename "${dest}")"
