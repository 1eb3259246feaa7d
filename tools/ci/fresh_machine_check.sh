#!/usr/bin/env bash
# Checks that the README's commands set up everything on a fresh Debian 12:
# builds a minimal Debian bookworm chroot with debootstrap, binds only
# /usr/local/cuda into it, clones this repository there and runs the given
# tools/bazel command (default: the test command). Needs root and network
# access to Debian's mirror. Usage:
#   tools/ci/fresh_machine_check.sh [CHROOT_DIR] [-- tools/bazel ARGS...]
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
root=${1:-/var/tmp/megatron_cpp_chroot}
shift || true
[[ "${1:-}" == "--" ]] && shift
cmd=("$@")
((${#cmd[@]} == 0)) && cmd=(tools/bazel test //...)

if [[ "$(id -u)" != 0 ]]; then
  echo "fresh_machine_check: needs root (debootstrap, chroot, mounts)" >&2
  exit 1
fi
command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap

if [[ ! -x "${root}/usr/bin/apt-get" ]]; then
  mkdir -p "${root}"
  debootstrap --variant=minbase bookworm "${root}" http://deb.debian.org/debian
  cat > "${root}/etc/apt/sources.list" <<'SOURCES'
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian-security bookworm-security main
deb http://deb.debian.org/debian bookworm-updates main
SOURCES
fi
cp /etc/resolv.conf "${root}/etc/resolv.conf"

cuda=$(readlink -f /usr/local/cuda)
mkdir -p "${root}${cuda}" "${root}/proc" "${root}/dev" "${root}/sys"
mountpoint -q "${root}${cuda}" || mount --bind "${cuda}" "${root}${cuda}"
ln -sfn "${cuda}" "${root}/usr/local/cuda"
mountpoint -q "${root}/proc" || mount -t proc proc "${root}/proc"
mountpoint -q "${root}/dev" || mount --rbind /dev "${root}/dev"
mountpoint -q "${root}/sys" || mount --rbind /sys "${root}/sys"

rm -rf "${root}/root/repo"
git clone -q "${repo}" "${root}/root/repo"
echo "fresh_machine_check: running '${cmd[*]}' in ${root}" >&2
chroot "${root}" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  /bin/bash -c "cd /root/repo && $(printf '%q ' "${cmd[@]}")"
