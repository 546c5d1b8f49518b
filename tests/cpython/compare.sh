#!/usr/bin/env bash
# Proves that the LD_PRELOAD shim is invisible to a real program: runs CPython's own regression
# tests (a few minutes' worth) plainly, under libvrange_malloc.so, and under it with
# VRANGE_MALLOC_THRESHOLD=16K, and fails unless every test case ends the same way each time.
# compare.py beside it does the work and explains the checks.
#
#   tests/cpython/compare.sh [path/to/libvrange_malloc.so] [--plain-twice]
#
# The shim defaults to ${CARGO_TARGET_DIR:-target}/release/libvrange_malloc.so, built if missing.
# Needs Debian's /usr/bin/python3 and libpython3.11-testsuite: without them this prints
# `skipped: <reason>` and exits 0, except under CI=true, where it fails.
set -euo pipefail

shim=
flags=()
for arg in "$@"; do
  case "$arg" in
    --*) flags+=("$arg") ;;
    *) shim=$(realpath -m "$arg") ;;
  esac
done
cd "$(dirname "$0")/../.."

skip() {
  [ -n "${VRANGE_SKIP_LOG:-}" ] && echo "tests/cpython/compare.sh: $1" >> "$VRANGE_SKIP_LOG"
  if [ "${CI:-}" = true ]; then
    echo "error: $1 (required under CI)" >&2
    exit 1
  fi
  echo "skipped: $1"
  exit 0
}

[ -x /usr/bin/python3 ] || skip "/usr/bin/python3 not found"
/usr/bin/python3 -c 'import test.libregrtest, test.test_posix' 2>/dev/null \
  || skip "CPython's regression tests not installed (apt-get install libpython3.11-testsuite)"

if [ -z "$shim" ]; then
  shim=${CARGO_TARGET_DIR:-target}/release/libvrange_malloc.so
  [ -f "$shim" ] || cargo build --release -q -p vrange-malloc-preload
fi
[ -f "$shim" ] || { echo "error: $shim not found" >&2; exit 1; }

exec /usr/bin/python3 tests/cpython/compare.py "$shim" "${flags[@]}"
