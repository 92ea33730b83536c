#!/usr/bin/env bash
# Build the images the compose testnet uses: dekube-node (validators, relays), dekube-compute
# (torch CPU) and dekube-router (NAT routers).
#   deploy/build-images.sh              BASE=python:3.11-slim from a registry, pip from PyPI
#   deploy/build-images.sh --offline    no image registry: the base from deploy/build-base.sh (made if
#                                       absent) and every wheel downloaded here first into deploy/wheels
# Env: BASE (base image), TAG (default latest).
set -euo pipefail
cd "$(dirname "$0")/.."
TAG="${TAG:-latest}"
ARGS=()
if [ "${1:-}" = "--offline" ]; then
  BASE="${BASE:-dekube/base:bookworm}"
  docker image inspect "$BASE" >/dev/null 2>&1 || bash deploy/build-base.sh "$BASE"
  # the host's pip (its index and local wheel cache) fetches what the image needs; torch is pinned
  # to the CPU build already installed here when there is one
  python3 -m pip download -q -d deploy/wheels "pip>=23" "setuptools>=68" wheel ".[compute]" 2>&1 \
    | { grep -v "^WARNING: Location" || true; } >&2
  rm -f deploy/wheels/dekube-*
  ARGS+=(--build-arg "PIP_ARGS=--no-index" --build-arg "TORCH_INDEX=")
fi
BASE="${BASE:-python:3.11-slim}"
export DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-0}"
for target in node compute router; do
  start=$(date +%s)
  docker build -q --network host --build-arg "BASE=$BASE" "${ARGS[@]}" --target "$target" \
    -t "dekube-$target:$TAG" . >/dev/null
  echo "built dekube-$target:$TAG from $BASE in $(( $(date +%s) - start )) s"
done
