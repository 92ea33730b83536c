#!/usr/bin/env bash
# Lint and type-check with the configuration in pyproject.toml ([tool.ruff], [tool.mypy]):
# ruff (E, F, W, I, B, UP) over the whole tree, then mypy over the packages it lists (strict on
# node.p2p and the consensus core, gradual elsewhere). Needs the test extra (ruff, mypy).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
status=0
"$PY" -m ruff check . || status=1
"$PY" -m mypy || status=1
exit $status
