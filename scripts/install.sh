#!/usr/bin/env bash
# Installs dekube and its test dependencies into the current Python environment.
# torch is pinned to 2.13.0 (a CPU wheel on these machines; an unpinned torch pulls CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[test]"
