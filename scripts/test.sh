#!/usr/bin/env bash
# Installs everything and runs the default test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec "${PYTHON:-python3}" -m pytest "$@"
