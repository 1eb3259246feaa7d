#!/usr/bin/env bash
# The check behind layering_test (core/testing/layering.bzl), over the
# package's genquery outputs:
#   --rules FILE     paths from the package's non-test targets to targets of
#                    a higher layer: must be empty;
#   --tests FILE     the package's tests that name a non-test target of a
#                    higher layer directly, and those targets: must be empty;
#   --unlisted FILE  targets the package reaches in layered folders whose
#                    package is not in LAYERED_PACKAGES: must be empty;
#   --upward FILE NAME  a test listed in upward_tests: its direct non-test
#                    dependencies in a higher layer, which must not be empty
#                    (else the entry is stale; it also shows that the query
#                    does find an upward edge).
set -euo pipefail

layer="" package="" failed=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --layer) layer="$2"; shift 2 ;;
    --package) package="$2"; shift 2 ;;
    --rules)
      if [[ -s "$2" ]]; then
        echo "//${package} (layer ${layer}): these non-test targets reach a higher layer" >&2
        echo "(core/testing/layering.bzl). Every target on a path from one of this" >&2
        echo "package's targets to a higher layer's:" >&2
        sed 's/^/  /' "$2" >&2
        failed=1
      fi
      shift 2 ;;
    --tests)
      if [[ -s "$2" ]]; then
        echo "//${package} (layer ${layer}): a test here names a library or binary of a" >&2
        echo "higher layer directly; use a test-only harness of that layer, move the" >&2
        echo "test up, or list it with its reason in upward_tests. The tests and the" >&2
        echo "targets they reach up to:" >&2
        sed 's/^/  /' "$2" >&2
        failed=1
      fi
      shift 2 ;;
    --unlisted)
      if [[ -s "$2" ]]; then
        echo "//${package}: it depends on packages that are not in LAYERED_PACKAGES" >&2
        echo "(core/testing/layering.bzl), so they are not checked; add them there and" >&2
        echo "call layering_test() last in their BUILD files:" >&2
        sed 's/^/  /' "$2" >&2
        failed=1
      fi
      shift 2 ;;
    --upward)
      if [[ ! -s "$2" ]]; then
        echo "//${package}:$3 is in upward_tests but names nothing of a higher layer" >&2
        echo "directly any more: remove it from upward_tests." >&2
        failed=1
      else
        echo "allowed: //${package}:$3 names $(tr '\n' ' ' < "$2")"
      fi
      shift 3 ;;
    *) echo "check_layering.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ "${failed}" -ne 0 ]]; then
  exit 1
fi
echo "//${package} (layer ${layer}): every dependency runs down the layers."
