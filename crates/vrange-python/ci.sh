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

python3 -m pip install -q maturin pytest
python3 -m pip install -q ./crates/vrange-python
python3 -m pytest -q -p no:cacheprovider crates/vrange-python/tests
