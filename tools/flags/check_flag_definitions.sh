#!/usr/bin/env bash
# Lists every Abseil flag definition (ABSL_FLAG, ABSL_RETIRED_FLAG) in the
# source tree and fails on one outside the places flags may live: libraries
# take their options through config structs, protos or setters, never through
# global flags, so that a program or workspace linking a library inherits no
# flags from it. Allowed:
#   - a file that defines main(): the binaries' programs under tools/, test
#     mains, benchmark and example programs;
#   - a benchmark source (*bench*.cc);
#   - tools/flags/, the one library of flags (Megatron's names onto the
#     configs, the runtime flags);
#   - examples/ (workspaces of their own);
#   - the files on BEING_REMOVED below.
# The tree is the checkout this script lies in (its runfile resolves there),
# not the test's declared inputs, so the test is tagged "external" (never
# cached): a new definition anywhere is seen on the next run.
set -euo pipefail

# Libraries that still define flags, each on its way out; delete the entry
# when its flags have moved, and never add one.
BEING_REMOVED=(
)

script="$(readlink -f "${BASH_SOURCE[0]}")"
root="$(cd "$(dirname "${script}")/../.." && pwd)"
cd "${root}"
[[ -f WORKSPACE && -d tools/flags ]] || {
  echo "check_flag_definitions.sh: ${root} is not the workspace root" >&2
  exit 2
}

place_of() {  # Why $1 may define flags, or nothing.
  local f="$1" r
  for r in "${BEING_REMOVED[@]}"; do
    [[ "${f}" == "${r}" ]] && { echo "being removed"; return; }
  done
  case "${f}" in
    tools/flags/*) echo "tools/flags"; return ;;
    examples/*) echo "example"; return ;;
  esac
  case "$(basename "${f}")" in
    *bench*.cc) echo "benchmark"; return ;;
  esac
  if grep -qE '^int main\(' "${f}"; then echo "program (main)"; fi
}

mapfile -t files < <(grep -rlE --include='*.cc' --include='*.h' \
  --exclude-dir=.git '^[[:space:]]*ABSL_(RETIRED_)?FLAG\(' . | sed 's|^\./||' | sort)
if [[ ${#files[@]} -eq 0 ]]; then
  echo "check_flag_definitions.sh: no flag definitions found under ${root};" \
    "the search is broken" >&2
  exit 2
fi

bad=() count=0
for f in "${files[@]}"; do
  place="$(place_of "${f}")"
  n=$(grep -cE '^[[:space:]]*ABSL_(RETIRED_)?FLAG\(' "${f}")
  count=$((count + n))
  echo "${f}: ${n} flag(s), ${place:-NOT ALLOWED}"
  [[ -z "${place}" ]] && bad+=("${f}")
done
for r in "${BEING_REMOVED[@]}"; do
  if ! printf '%s\n' "${files[@]}" | grep -qxF "${r}"; then
    echo "${r} defines no flags any more: remove it from BEING_REMOVED" \
      "(tools/flags/check_flag_definitions.sh)." >&2
    bad+=("${r} (stale BEING_REMOVED entry)")
  fi
done
echo "${count} flag definitions in ${#files[@]} files."
if [[ ${#bad[@]} -gt 0 ]]; then
  echo >&2
  echo "Flags defined outside a program, a benchmark, tools/flags or an" >&2
  echo "example; give the library an option (a config field, a setter) and" >&2
  echo "define the flag in tools/flags or the binary:" >&2
  for f in "${bad[@]}"; do
    echo "  ${f}" >&2
    grep -nE '^[[:space:]]*ABSL_(RETIRED_)?FLAG\(' "${f}" 2>/dev/null | sed 's/^/    /' >&2 || true
  done
  exit 1
fi
