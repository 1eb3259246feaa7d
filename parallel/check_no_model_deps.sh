#!/usr/bin/env bash
# Fails when the query output $1 (the paths from a package's non-test
# targets to //models targets) is not empty, printing those paths. With $2
# (the canary query: a testonly target's //models dependencies), also fails
# when that is empty, since then the query itself is not finding anything.
set -euo pipefail

paths="$1"
if [[ -s "${paths}" ]]; then
  echo "These non-test //parallel targets reach //models (the parallel" >&2
  echo "libraries must take the model contract, //parallel:model, instead)." >&2
  echo "Every target on a path from a //parallel target to a //models one:" >&2
  sed 's/^/  /' "${paths}" >&2
  exit 1
fi
if [[ $# -ge 2 ]]; then
  if [[ ! -s "$2" ]]; then
    echo "The canary query found no //models dependency of the canary" >&2
    echo "target, so the check cannot be trusted; see no_model_deps.bzl." >&2
    exit 1
  fi
  echo "canary: the query sees $(wc -l < "$2") //models targets from the canary."
fi
echo "no //models dependency in $(basename "$(dirname "${paths}")")'s non-test targets."
