#!/usr/bin/env bash
# The Python module's checks, for .ci/run (works from any directory; runs from the repo root):
# formatting and lints of its crate (its own cargo workspace), then a real `pip install` of the
# package as a user would do it (pip fetches maturin for the isolated build) and its pytest
# suite against the installed module.
set -euxo pipefail
cd "$(dirname "$0")/../.."

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

(
  cd crates/vrange-python
  cargo fmt --check
  cargo clippy --all-targets -- -D warnings
)

python3 -m pip install -q maturin pytest mypy cachetools
python3 -m pip install -q ./crates/vrange-python
python3 -m pytest -q -p no:cacheprovider crates/vrange-python/tests

# Type information, as a user's checker meets it: from a directory outside the tree, so that
# mypy finds the installed package's stub (vrange/__init__.pyi, with py.typed), not the
# source's; the stub is checked against the installed module, and typed code against the stub.
repo=$PWD
(
  cd /tmp
  python3 -m mypy.stubtest vrange \
    --allowlist "$repo/crates/vrange-python/stubtest-allowlist.txt" --ignore-unused-allowlist
  python3 -m mypy --strict --cache-dir=/dev/null "$repo/crates/vrange-python/tests/test_typing.py"
)

# A wheel, as Python projects ship one (maturin build), installed with pip into a fresh
# virtual environment of Debian's own interpreter (/usr/bin/python3, not the one above), and
# the suite run against it there.
if [ -x /usr/bin/python3 ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m maturin build --release --quiet -i /usr/bin/python3 \
    -m crates/vrange-python/Cargo.toml -o "$work/wheels"
  /usr/bin/python3 -m venv "$work/venv"
  "$work/venv/bin/python" -m pip install -q "$work"/wheels/vrange-*.whl pytest cachetools
  "$work/venv/bin/python" -c 'import sys, vrange; print("wheel on", sys.version.split()[0], "->", vrange.__file__)'
  "$work/venv/bin/python" -m pytest -q -p no:cacheprovider crates/vrange-python/tests
fi
